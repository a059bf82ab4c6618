// The chaos driver of `watchcache-bench chaos --front grpc`: etcd's Go
// client (clientv3) doing what the bench's Rust clients do, through the
// front, while the bench injects faults. It prints one JSON line per record
// for the bench's checkers:
//
//	{"op": ...}      a KV operation in porcupine's format (put, delete, txn,
//	                 linearizable get): client, call, return (0: unknown),
//	                 input, output
//	{"serial": ...}  a serializable get: the highest revision seen before,
//	                 the answer's revision and the key's value and mod_revision
//	{"watch": ...}   one watch and every response it got (at its end)
//	{"big": ...}     a revision of 4 x 300 KiB (keys kbig0..3, not in
//	                 porcupine's history), which the front must fragment for
//	                 a watch that asks for fragments (this one's does)
//
// Times are nanoseconds since --t0 on CLOCK_MONOTONIC, the bench's clock.
// Values are JSON strings, as the bench writes them. The watches are
// clientv3's own: a broken stream is resumed by clientv3 from the next
// revision, so one watch's responses must be gapless across resumes.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

type chaosRun struct {
	t0     int64
	prefix string
	mu     sync.Mutex
	out    *json.Encoder
}

func (c *chaosRun) now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() - c.t0
}

func (c *chaosRun) emit(kind string, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.out.Encode(map[string]any{kind: v})
}

func encodeValue(v string) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func decodeValue(b []byte) string {
	var s string
	if json.Unmarshal(b, &s) == nil {
		return s
	}
	return string(b)
}

func chaos(endpoint, prefix string, keys, id int, t0, seed int64, d time.Duration) int {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cli.Close()
	c := &chaosRun{t0: t0, prefix: prefix, out: json.NewEncoder(os.Stdout)}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c.kvWorker(ctx, cli, id+w, keys, w == 0, rand.New(rand.NewSource(seed*1000+int64(w))))
		}(w)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.watcher(ctx, cli, fmt.Sprintf("clientv3-watch-%d", id), rand.New(rand.NewSource(seed*1000+99)))
	}()
	wg.Wait()
	return 0
}

func op(client int, call, ret int64, input, output map[string]any) map[string]any {
	return map[string]any{"client": client, "call": call, "return": ret, "input": input, "output": output}
}

// kvWorker: Put, Delete, Txn (put if mod_revision is the last one seen,
// else get), linearizable and serializable gets, about 5 a second.
func (c *chaosRun) kvWorker(ctx context.Context, cli *clientv3.Client, id, keys int, big bool, rng *rand.Rand) {
	seen := int64(0)
	lastMod := map[string]int64{}
	nextBig := time.Now().Add(time.Duration(5+rng.Intn(10)) * time.Second)
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(100+rng.Intn(200)) * time.Millisecond):
		}
		if big && time.Now().After(nextBig) {
			nextBig = time.Now().Add(time.Duration(20+rng.Intn(20)) * time.Second)
			c.bigRevision(ctx, cli, id, n)
			continue
		}
		name := fmt.Sprintf("k%02d", rng.Intn(keys))
		key := c.prefix + name
		value := fmt.Sprintf("g%d-%d", id, n)
		octx, ocancel := context.WithTimeout(ctx, 5*time.Second)
		call := c.now()
		switch dice := rng.Intn(100); {
		case dice < 30:
			r, err := cli.Put(octx, key, encodeValue(value))
			in := map[string]any{"op": "put", "key": name, "value": value}
			if err != nil {
				c.emit("op", op(id, call, 0, in, map[string]any{"unknown": true}))
			} else {
				seen = max(seen, r.Header.Revision)
				c.emit("op", op(id, call, c.now(), in, map[string]any{"rev": r.Header.Revision}))
			}
		case dice < 40:
			r, err := cli.Delete(octx, key)
			in := map[string]any{"op": "delete", "key": name}
			if err != nil {
				c.emit("op", op(id, call, 0, in, map[string]any{"unknown": true}))
			} else {
				seen = max(seen, r.Header.Revision)
				c.emit("op", op(id, call, c.now(), in, map[string]any{"rev": r.Header.Revision, "deleted": r.Deleted}))
			}
		case dice < 60:
			expect := lastMod[name]
			r, err := cli.Txn(octx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", expect)).
				Then(clientv3.OpPut(key, encodeValue(value))).
				Else(clientv3.OpGet(key)).
				Commit()
			in := map[string]any{"op": "txn", "key": name, "value": value, "expect": expect}
			out := map[string]any{"unknown": true}
			ret := int64(0)
			if err == nil {
				rev := r.Header.Revision
				seen = max(seen, rev)
				ret = c.now()
				if r.Succeeded {
					lastMod[name] = rev
					out = map[string]any{"rev": rev, "succeeded": true}
				} else if len(r.Responses) == 1 && r.Responses[0].GetResponseRange() != nil {
					kvs := r.Responses[0].GetResponseRange().Kvs
					if len(kvs) > 0 {
						lastMod[name] = kvs[0].ModRevision
						out = map[string]any{"rev": rev, "exists": true, "value": decodeValue(kvs[0].Value), "mod_rev": kvs[0].ModRevision}
					} else {
						delete(lastMod, name)
						out = map[string]any{"rev": rev, "exists": false}
					}
				} else {
					ret = 0
				}
			}
			c.emit("op", op(id, call, ret, in, out))
		case dice < 80:
			r, err := cli.Get(octx, key)
			if err == nil {
				seen = max(seen, r.Header.Revision)
				out := map[string]any{"rev": r.Header.Revision, "exists": false}
				if len(r.Kvs) > 0 {
					lastMod[name] = r.Kvs[0].ModRevision
					out = map[string]any{"rev": r.Header.Revision, "exists": true, "value": decodeValue(r.Kvs[0].Value), "mod_rev": r.Kvs[0].ModRevision}
				} else {
					delete(lastMod, name)
				}
				c.emit("op", op(id, call, c.now(), map[string]any{"op": "get", "key": name}, out))
			}
		default:
			floor := seen
			r, err := cli.Get(octx, key, clientv3.WithSerializable())
			if err == nil {
				seen = max(seen, r.Header.Revision)
				rec := map[string]any{"client": fmt.Sprintf("clientv3-%d", id), "key": name, "floor": floor, "rev": r.Header.Revision}
				if len(r.Kvs) > 0 {
					rec["value"] = decodeValue(r.Kvs[0].Value)
					rec["mod_rev"] = r.Kvs[0].ModRevision
				}
				c.emit("serial", rec)
			}
		}
		ocancel()
	}
}

// bigRevision writes kbig0..3 (300 KiB each) in one revision: with prev_kv
// about 2.4 MiB of events, over etcd's 1.5 MiB request limit.
func (c *chaosRun) bigRevision(ctx context.Context, cli *clientv3.Client, id, n int) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	fill := strings.Repeat("x", 300*1024)
	ops := []clientv3.Op{}
	for i := 0; i < 4; i++ {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%skbig%d", c.prefix, i), encodeValue(fmt.Sprintf("g%d-%d-%s", id, n, fill))))
	}
	if r, err := cli.Txn(octx).Then(ops...).Commit(); err == nil {
		c.emit("big", map[string]any{"rev": r.Header.Revision})
	}
}

// watcher: a prefix watch with prev_kv, progress notifications and
// requests, and fragments (clientv3 joins them), re-created every 5-15 s
// from the revision after the last one it got; clientv3 resumes it by
// itself after a broken stream.
func (c *chaosRun) watcher(ctx context.Context, cli *clientv3.Client, name string, rng *rand.Rand) {
	next := int64(0)
	for ctx.Err() == nil {
		wctx, wcancel := context.WithTimeout(ctx, time.Duration(5+rng.Intn(10))*time.Second)
		wctx = clientv3.WithRequireLeader(wctx)
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify(), clientv3.WithFragment()}
		if next > 0 {
			opts = append(opts, clientv3.WithRev(next))
		}
		log := map[string]any{"client": name, "key": "k", "prefix": true, "start_rev": next, "created_rev": 0, "sent_at": c.now(), "prev_kv": true}
		resps := []map[string]any{}
		end := "canceled"
		ch := cli.Watch(wctx, c.prefix+"k", opts...)
		tick := time.NewTicker(time.Duration(1000+rng.Intn(2000)) * time.Millisecond)
	loop:
		for {
			select {
			case <-tick.C:
				_ = cli.RequestProgress(wctx)
			case r, ok := <-ch:
				if !ok {
					if ctx.Err() != nil {
						end = "stopped"
					}
					break loop
				}
				if r.CompactRevision > 0 {
					log["compacted"] = r.CompactRevision
					end = "compacted"
					next = 0
					break loop
				}
				if err := r.Err(); err != nil {
					end = "broken: " + err.Error()
					break loop
				}
				if r.Created {
					log["created_rev"] = r.Header.Revision
					continue
				}
				evs := []map[string]any{}
				for _, e := range r.Events {
					key, _ := strings.CutPrefix(string(e.Kv.Key), c.prefix)
					ev := map[string]any{"delete": e.Type == clientv3.EventTypeDelete, "key": key, "mod_rev": e.Kv.ModRevision, "create_rev": e.Kv.CreateRevision, "version": e.Kv.Version, "value": ""}
					if e.Type != clientv3.EventTypeDelete {
						ev["value"] = decodeValue(e.Kv.Value)
					}
					if e.PrevKv != nil {
						ev["prev"] = []any{decodeValue(e.PrevKv.Value), e.PrevKv.ModRevision}
					}
					evs = append(evs, ev)
					next = e.Kv.ModRevision + 1
				}
				resps = append(resps, map[string]any{"rev": r.Header.Revision, "events": evs, "progress": r.IsProgressNotify()})
			}
		}
		tick.Stop()
		wcancel()
		log["resps"] = resps
		log["end"] = end
		log["ended_at"] = c.now()
		c.emit("watch", log)
		if strings.HasPrefix(end, "broken") {
			// clientv3 gave up (a halting error: no leader, the front
			// gone); wait before the next watch, as a controller would.
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(200+rng.Intn(800)) * time.Millisecond):
			}
		}
	}
}
