// Linearizability check of a KV history recorded by `watchcache-bench chaos
// --front grpc` (docs/RELIABILITY.md), with porcupine and an etcd-like model,
// partitioned by key as etcd's robustness suite may partition it.
//
//	porcupine HISTORY.json [TIMEOUT_SECONDS]
//
// HISTORY.json: {"ops": [{"client": 0, "call": ns, "return": ns,
// "input": {"op": "put|delete|txn|get", "key": "k", "value": "v", "expect": modrev},
// "output": {"unknown": bool, "rev": r, "deleted": n, "succeeded": bool,
// "exists": bool, "value": "v", "mod_rev": m}}]}. A write whose answer was
// lost has "unknown": true and a return of 0 (read as "never returned").
// Prints {"result": "Ok|Illegal|Unknown", "ops": n, "keys": n, "illegal": [keys],
// "unknown": [keys]} and exits 0 unless the history cannot be read.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/anishathalye/porcupine"
)

type input struct {
	Op     string `json:"op"`
	Key    string `json:"key"`
	Value  string `json:"value"`
	Expect int64  `json:"expect"`
}

type output struct {
	Unknown   bool   `json:"unknown"`
	Rev       int64  `json:"rev"`
	Deleted   int64  `json:"deleted"`
	Succeeded bool   `json:"succeeded"`
	Exists    bool   `json:"exists"`
	Value     string `json:"value"`
	ModRev    int64  `json:"mod_rev"`
}

type op struct {
	Client int    `json:"client"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
	Input  input  `json:"input"`
	Output output `json:"output"`
}

// state of one key. ModRev -1: written by a write whose answer was lost (its
// revision is unknown, so the next read adopts what it sees). Floor: the
// highest revision of any operation linearized so far (a later write gets a
// higher one; a later read sees at least it).
type state struct {
	Exists bool
	Value  string
	ModRev int64
	Floor  int64
}

func step(st, in, out interface{}) (bool, interface{}) {
	s := st.(state)
	i := in.(input)
	o := out.(output)
	written := func(rev int64) state {
		if o.Unknown {
			return state{true, i.Value, -1, s.Floor}
		}
		return state{true, i.Value, rev, rev}
	}
	read := func() (bool, interface{}) {
		if o.Exists != s.Exists || o.Rev < s.Floor {
			return false, s
		}
		if s.Exists && (o.Value != s.Value || (s.ModRev >= 0 && o.ModRev != s.ModRev)) {
			return false, s
		}
		n := s
		n.Floor = o.Rev
		if s.Exists && s.ModRev < 0 {
			if o.ModRev <= s.Floor {
				return false, s
			}
			n.ModRev = o.ModRev
		}
		return true, n
	}
	switch i.Op {
	case "put":
		if !o.Unknown && o.Rev <= s.Floor {
			return false, s
		}
		return true, written(o.Rev)
	case "delete":
		if o.Unknown {
			return true, state{false, "", 0, s.Floor}
		}
		if s.Exists {
			if o.Deleted != 1 || o.Rev <= s.Floor {
				return false, s
			}
			return true, state{false, "", 0, o.Rev}
		}
		if o.Deleted != 0 || o.Rev < s.Floor {
			return false, s
		}
		return true, state{false, "", 0, o.Rev}
	case "txn":
		// if mod_revision(key) == expect then put else get.
		var cond bool
		known := true
		switch {
		case !s.Exists:
			cond = i.Expect == 0
		case s.ModRev < 0:
			known = false
			cond = i.Expect > s.Floor
		default:
			cond = s.ModRev == i.Expect
		}
		if o.Unknown {
			if cond {
				return true, written(0)
			}
			return true, s
		}
		if known && o.Succeeded != cond {
			return false, s
		}
		if o.Succeeded {
			if o.Rev <= s.Floor || (!known && i.Expect <= s.Floor) {
				return false, s
			}
			return true, written(o.Rev)
		}
		return read()
	case "get":
		return read()
	}
	return false, s
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: porcupine HISTORY.json [TIMEOUT_SECONDS]")
		os.Exit(2)
	}
	timeout := 60 * time.Second
	if len(os.Args) > 2 {
		s, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad timeout:", err)
			os.Exit(2)
		}
		timeout = time.Duration(s) * time.Second
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var h struct {
		Ops []op `json:"ops"`
	}
	if err := json.Unmarshal(data, &h); err != nil {
		fmt.Fprintln(os.Stderr, "reading the history:", err)
		os.Exit(2)
	}
	byKey := map[string][]porcupine.Operation{}
	for _, o := range h.Ops {
		ret := o.Return
		if o.Output.Unknown || ret == 0 {
			ret = math.MaxInt64
		}
		byKey[o.Input.Key] = append(byKey[o.Input.Key], porcupine.Operation{
			ClientId: o.Client, Input: o.Input, Call: o.Call, Output: o.Output, Return: ret,
		})
	}
	model := porcupine.Model{
		Init: func() interface{} { return state{} },
		Step: step,
		DescribeOperation: func(in, out interface{}) string {
			return fmt.Sprintf("%+v -> %+v", in, out)
		},
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	result := porcupine.Ok
	illegal, unknown := []string{}, []string{}
	for _, k := range keys {
		switch porcupine.CheckOperationsTimeout(model, byKey[k], timeout) {
		case porcupine.Illegal:
			illegal = append(illegal, k)
			result = porcupine.Illegal
		case porcupine.Unknown:
			unknown = append(unknown, k)
			if result == porcupine.Ok {
				result = porcupine.Unknown
			}
		}
	}
	enc := json.NewEncoder(os.Stdout)
	_ = enc.Encode(map[string]interface{}{
		"result": result, "ops": len(h.Ops), "keys": len(keys),
		"illegal": illegal, "unknown": unknown,
	})
}
