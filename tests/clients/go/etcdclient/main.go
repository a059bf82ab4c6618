// etcdclient runs a fixed scenario of etcd's Go client (go.etcd.io/etcd/client/v3)
// against one endpoint and prints a normalized transcript, one JSON line per
// step, for tests/etcd_clients.rs to compare between etcd itself and the
// watchcache gRPC front. Only what must differ between two etcds is left
// out: cluster and member ids (headers keep revision and raft term), lease
// ids (printed as L1, L2, ... in the order granted) and remaining TTLs
// (printed as whether they lie in (0, granted]).
//
//	etcdclient --endpoint http://127.0.0.1:2379 --prefix /registry/pods/
//
// Keys under --prefix are the front's cached prefix; --other names keys
// outside it (passed to etcd). The scenario expects a fresh etcd: it
// compacts.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type step map[string]any

var (
	leases = map[clientv3.LeaseID]string{}
	out    = json.NewEncoder(os.Stdout)
)

func lease(id clientv3.LeaseID) string {
	if id == 0 {
		return ""
	}
	if l, ok := leases[id]; ok {
		return l
	}
	l := "L" + strconv.Itoa(len(leases)+1)
	leases[id] = l
	return l
}

func header(h *etcdserverpb.ResponseHeader) step {
	if h == nil {
		return nil
	}
	return step{"revision": h.Revision, "raft_term": h.RaftTerm}
}

// anyHeader: a watch response's header is a value in 3.6 and a pointer in 3.7.
func anyHeader(h any) step {
	switch x := h.(type) {
	case *etcdserverpb.ResponseHeader:
		return header(x)
	case etcdserverpb.ResponseHeader:
		return header(&x)
	}
	return nil
}

func kv(k *mvccpb.KeyValue) step {
	if k == nil {
		return nil
	}
	return step{
		"key": string(k.Key), "value": string(k.Value), "create": k.CreateRevision,
		"mod": k.ModRevision, "version": k.Version, "lease": lease(clientv3.LeaseID(k.Lease)),
	}
}

func kvs(list []*mvccpb.KeyValue) []step {
	r := []step{}
	for _, k := range list {
		r = append(r, kv(k))
	}
	return r
}

func range_(r *etcdserverpb.RangeResponse) step {
	return step{"header": header(r.Header), "kvs": kvs(r.Kvs), "more": r.More, "count": r.Count}
}

func print(name string, s step, err error) {
	if s == nil {
		s = step{}
	}
	s["step"] = name
	if err != nil {
		s["error"] = err.Error()
	}
	if e := out.Encode(s); e != nil {
		fmt.Fprintln(os.Stderr, e)
		os.Exit(1)
	}
}

func main() {
	endpoint := flag.String("endpoint", "", "etcd or front endpoint")
	prefix := flag.String("prefix", "", "a prefix the front caches, ending in /")
	other := flag.String("other", "", "a prefix outside the cached ones, ending in /")
	chaosFor := flag.Duration("chaos", 0, "run the chaos driver (chaos.go) this long instead of the scenario")
	keys := flag.Int("keys", 20, "chaos: the keys k00.. under --prefix")
	id := flag.Int("client-id", 100, "chaos: the first porcupine client id")
	t0 := flag.Int64("t0", 0, "chaos: CLOCK_MONOTONIC ns of the run's start (times are ns since)")
	seed := flag.Int64("seed", 1, "chaos: the seed of the operation mix")
	flag.Parse()
	if *chaosFor > 0 && *endpoint != "" && *prefix != "" {
		os.Exit(chaos(*endpoint, *prefix, *keys, *id, *t0, *seed, *chaosFor))
	}
	if *endpoint == "" || *prefix == "" || *other == "" {
		fmt.Fprintln(os.Stderr, "usage: etcdclient --endpoint URL --prefix P/ --other O/")
		os.Exit(2)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, o := *prefix, *other

	get := func(name, key string, opts ...clientv3.OpOption) {
		r, err := cli.Get(ctx, key, opts...)
		if err != nil {
			print(name, nil, err)
			return
		}
		print(name, range_((*etcdserverpb.RangeResponse)(r)), nil)
	}
	put := func(name, key, value string, opts ...clientv3.OpOption) int64 {
		r, err := cli.Put(ctx, key, value, opts...)
		if err != nil {
			print(name, nil, err)
			return 0
		}
		print(name, step{"header": header(r.Header), "prev_kv": kv(r.PrevKv)}, nil)
		return r.Header.Revision
	}

	// Writes: puts (one with prev_kv), a key outside the cached prefix.
	put("put a", p+"a", "1")
	put("put b", p+"b", "two")
	mid := put("put a again", p+"a", "1-again", clientv3.WithPrevKV())
	put("put c", p+"c", `{"kind":"Pod"}`)
	put("put d", p+"d", "\xff\x00\x01")
	put("put other", o+"x", "outside")
	// Linearizable, at a past revision: the header has etcd's current
	// revision (the write outside the cached prefix), not the cache's.
	get("get a at mid", p+"a", clientv3.WithRev(mid))

	// Reads: prefix, limit, sorts, from-key, count-only, keys-only, past
	// revisions, serializable, revision filters.
	get("get prefix", p, clientv3.WithPrefix())
	get("get limit 2", p, clientv3.WithPrefix(), clientv3.WithLimit(2))
	get("get sort mod desc", p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
	get("get sort create", p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	get("get sort version desc limit 1", p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByVersion, clientv3.SortDescend), clientv3.WithLimit(1))
	get("get sort value", p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortAscend))
	get("get sort key desc", p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	get("get from key c", p+"c", clientv3.WithFromKey())
	get("get range a..c", p+"a", clientv3.WithRange(p+"c"))
	get("get count only", p, clientv3.WithPrefix(), clientv3.WithCountOnly())
	get("get keys only", p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	get("get at mid", p, clientv3.WithPrefix(), clientv3.WithRev(mid))
	get("get a at mid serializable", p+"a", clientv3.WithRev(mid), clientv3.WithSerializable())
	get("get serializable", p, clientv3.WithPrefix(), clientv3.WithSerializable())
	get("get min mod rev", p, clientv3.WithPrefix(), clientv3.WithMinModRev(mid))
	get("get max create rev", p, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(2))
	get("get missing", p+"zz")
	get("get other", o, clientv3.WithPrefix())
	get("get future revision", p, clientv3.WithPrefix(), clientv3.WithRev(1000))

	// Txn with compares: success and failure branches.
	txn := func(name string, cmp []clientv3.Cmp, then, els []clientv3.Op) int64 {
		r, err := cli.Txn(ctx).If(cmp...).Then(then...).Else(els...).Commit()
		if err != nil {
			print(name, nil, err)
			return 0
		}
		resps := []step{}
		for _, op := range r.Responses {
			switch x := op.Response.(type) {
			case *etcdserverpb.ResponseOp_ResponseRange:
				resps = append(resps, step{"range": range_(x.ResponseRange)})
			case *etcdserverpb.ResponseOp_ResponsePut:
				resps = append(resps, step{"put": kv(x.ResponsePut.PrevKv)})
			case *etcdserverpb.ResponseOp_ResponseDeleteRange:
				resps = append(resps, step{"deleted": x.ResponseDeleteRange.Deleted, "prev_kvs": kvs(x.ResponseDeleteRange.PrevKvs)})
			}
		}
		print(name, step{"header": header(r.Header), "succeeded": r.Succeeded, "responses": resps}, nil)
		return r.Header.Revision
	}
	putB := txn("txn value equal",
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(p+"b"), "=", "two")},
		[]clientv3.Op{clientv3.OpPut(p+"b", "three", clientv3.WithPrevKV()), clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly())},
		[]clientv3.Op{clientv3.OpGet(p + "b")})
	txn("txn version mismatch",
		[]clientv3.Cmp{clientv3.Compare(clientv3.Version(p+"a"), "=", 1)},
		[]clientv3.Op{clientv3.OpDelete(p + "a")},
		[]clientv3.Op{clientv3.OpGet(p + "a"), clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))})
	txn("txn mod and create revisions",
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(p+"c"), ">", 0), clientv3.Compare(clientv3.CreateRevision(p+"zz"), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(p+"e", "from-txn"), clientv3.OpDelete(p+"d", clientv3.WithPrevKV())},
		nil)

	// Delete with prev_kv, of one key and of nothing.
	del := func(name, key string, opts ...clientv3.OpOption) {
		r, err := cli.Delete(ctx, key, opts...)
		if err != nil {
			print(name, nil, err)
			return
		}
		print(name, step{"header": header(r.Header), "deleted": r.Deleted, "prev_kvs": kvs(r.PrevKvs)}, nil)
	}
	del("delete e with prev_kv", p+"e", clientv3.WithPrevKV())
	del("delete missing", p+"zz", clientv3.WithPrevKV())

	var leased int64
	// Leases: grant, a key attached, keepalive, time-to-live, list, revoke.
	g, err := cli.Grant(ctx, 600)
	if err != nil {
		print("lease grant", nil, err)
	} else {
		print("lease grant", step{"header": header(g.ResponseHeader), "id": lease(g.ID), "ttl": g.TTL}, nil)
		leased = put("put leased", p+"leased", "l", clientv3.WithLease(g.ID))
		k, err := cli.KeepAliveOnce(ctx, g.ID)
		if err != nil {
			print("lease keepalive", nil, err)
		} else {
			print("lease keepalive", step{"header": header(k.ResponseHeader), "id": lease(k.ID), "ttl": k.TTL}, nil)
		}
		t, err := cli.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
		if err != nil {
			print("lease timetolive", nil, err)
		} else {
			keys := []string{}
			for _, k := range t.Keys {
				keys = append(keys, string(k))
			}
			print("lease timetolive", step{"header": header(t.ResponseHeader), "id": lease(t.ID),
				"granted": t.GrantedTTL, "ttl_in_range": t.TTL > 0 && t.TTL <= t.GrantedTTL, "keys": keys}, nil)
		}
		l, err := cli.Leases(ctx)
		if err != nil {
			print("lease list", nil, err)
		} else {
			ids := []string{}
			for _, x := range l.Leases {
				ids = append(ids, lease(x.ID))
			}
			print("lease list", step{"header": header(l.ResponseHeader), "ids": ids}, nil)
		}
		get("get leased", p+"leased")
		get("get keys only with lease", p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		r, err := cli.Revoke(ctx, g.ID)
		if err != nil {
			print("lease revoke", nil, err)
		} else {
			print("lease revoke", step{"header": header(r.Header)}, nil)
		}
		get("get leased after revoke", p+"leased")
		t, err = cli.TimeToLive(ctx, g.ID)
		if err != nil {
			print("lease timetolive revoked", nil, err)
		} else {
			print("lease timetolive revoked", step{"ttl": t.TTL}, nil)
		}
	}
	_, err = cli.KeepAliveOnce(ctx, clientv3.LeaseID(12345))
	print("lease keepalive unknown", nil, err)

	// Watches from a past revision: prev_kv, filters, one key, a prefix.
	now, err := cli.Get(ctx, p+"a")
	if err != nil {
		print("get now", nil, err)
		os.Exit(1)
	}
	last := now.Header.Revision
	// watch reads events until one at revision `until` or later.
	watch := func(name string, until int64, key string, opts ...clientv3.OpOption) {
		wctx, wcancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), 10*time.Second)
		defer wcancel()
		events := []step{}
		for wr := range cli.Watch(wctx, key, opts...) {
			if wr.Canceled || wr.CompactRevision != 0 {
				s := step{"events": events, "canceled": wr.Canceled, "compact_revision": wr.CompactRevision}
				print(name, s, wr.Err())
				return
			}
			for _, ev := range wr.Events {
				events = append(events, step{"type": ev.Type.String(), "kv": kv(ev.Kv), "prev_kv": kv(ev.PrevKv)})
				if ev.Kv.ModRevision >= until {
					print(name, step{"events": events}, nil)
					return
				}
			}
		}
		print(name, step{"events": events}, wctx.Err())
	}
	watch("watch prefix from 1 prev_kv", last, p, clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithPrevKV())
	watch("watch prefix from mid no delete", leased, p, clientv3.WithPrefix(), clientv3.WithRev(mid), clientv3.WithFilterDelete())
	watch("watch prefix from mid no put prev_kv", last, p, clientv3.WithPrefix(), clientv3.WithRev(mid), clientv3.WithFilterPut(), clientv3.WithPrevKV())
	watch("watch key b from 1", putB, p+"b", clientv3.WithRev(1), clientv3.WithPrevKV())
	watch("watch from key c from mid", last, p+"c", clientv3.WithFromKey(), clientv3.WithRev(mid))

	// A progress request on a quiet watch, once its events up to now were
	// read: a notification at the current revision. (etcd 3.6 and later
	// answer none while a watch of the stream starts beyond it.)
	func() {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		wch := cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(last))
		events := 0
		for wr := range wch {
			if wr.IsProgressNotify() {
				print("watch progress", step{"header": anyHeader(wr.Header), "events": events}, nil)
				return
			}
			for _, ev := range wr.Events {
				events++
				if ev.Kv.ModRevision >= last {
					if err := cli.RequestProgress(wctx); err != nil {
						print("watch progress", nil, err)
						return
					}
				}
			}
		}
		print("watch progress", nil, wctx.Err())
	}()

	// Compaction, then reads and watches of revisions before and at it.
	put("put f", p+"f", "6")
	compactAt := put("put f again", p+"f", "7")
	put("put g", p+"g", "8")
	last = put("put f third", p+"f", "9")
	c, err := cli.Compact(ctx, compactAt, clientv3.WithCompactPhysical())
	if err != nil {
		print("compact", nil, err)
	} else {
		print("compact", step{"header": header(c.Header)}, nil)
	}
	_, err = cli.Compact(ctx, compactAt-1)
	print("compact again below", nil, err)
	_, err = cli.Compact(ctx, last+100)
	print("compact future", nil, err)
	get("get before compaction", p, clientv3.WithPrefix(), clientv3.WithRev(compactAt-1))
	get("get before compaction serializable", p, clientv3.WithPrefix(), clientv3.WithRev(compactAt-1), clientv3.WithSerializable())
	get("get a before compaction", p+"a", clientv3.WithRev(mid))
	get("get at compaction", p, clientv3.WithPrefix(), clientv3.WithRev(compactAt))
	get("get at compaction serializable", p, clientv3.WithPrefix(), clientv3.WithRev(compactAt), clientv3.WithSerializable())
	get("get after compaction", p, clientv3.WithPrefix(), clientv3.WithRev(compactAt+1))
	get("get other before compaction", o, clientv3.WithPrefix(), clientv3.WithRev(compactAt-1))
	watch("watch before compaction", last, p, clientv3.WithPrefix(), clientv3.WithRev(compactAt-1), clientv3.WithPrevKV())
	watch("watch from 1 after compaction", last, p+"f", clientv3.WithRev(1))
	watch("watch at compaction", last, p, clientv3.WithPrefix(), clientv3.WithRev(compactAt), clientv3.WithPrevKV())

	// Cluster and maintenance: what the front passes to etcd.
	m, err := cli.MemberList(ctx)
	if err != nil {
		print("member list", nil, err)
	} else {
		print("member list", step{"header": header(m.Header), "members": len(m.Members)}, nil)
	}
	st, err := cli.Status(ctx, *endpoint)
	if err != nil {
		print("status", nil, err)
	} else {
		print("status", step{"header": header(st.Header), "version": st.Version, "is_leader": st.Leader == st.Header.MemberId, "errors": st.Errors}, nil)
	}
}
