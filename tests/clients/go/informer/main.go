// A client-go informer against watchcache (issue "kube-apiserver as the
// oracle" §1/§3): a SharedIndexInformer on one resource of one namespace,
// over plain http. It prints SYNCED on stderr once the informer has synced.
// On each line "DUMP" read from stdin it prints its store as JSON lines
// {"namespace","name","resourceVersion"} sorted by namespace/name, then a
// line "END"; on stdin EOF or SIGTERM it prints the store once more (without
// END) and exits 0.
//
// client-go's WatchListClient feature gate follows env
// KUBE_FEATURE_WatchListClient=true|false (client-go's env feature gates);
// the program prints "WatchListClient=<bool>" and "client-go=<version>" on
// stderr as client-go sees them. --protobuf makes client-go ask for and send
// application/vnd.kubernetes.protobuf (its ContentType), as kube-controller-
// manager does. --metadata makes it a metadata informer (client-go's
// metadata client and metadatainformer: PartialObjectMetadata objects, as
// controller-runtime's OnlyMetadata watches use). --events prints each
// event handler call on stderr: "EVENT ADD <name> <rv>", "EVENT UPDATE
// <name> <old rv> <new rv>", "EVENT DELETE <name> <rv>" (a controller's
// view: what a missed or repeated watch event would show in).
//
// The same main.go is built against two client-go releases: go.mod (v0.34)
// and latest.mod (the newest the Go module proxy serves); see
// scripts/clients.sh.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

type entry struct {
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
}

func main() {
	server := flag.String("server", "", "watchcache URL (plain http)")
	resource := flag.String("resource", "configmaps", "configmaps|pods")
	namespace := flag.String("namespace", "default", "namespace (\"\" for all)")
	protobuf := flag.Bool("protobuf", false, "use application/vnd.kubernetes.protobuf instead of JSON")
	metadataOnly := flag.Bool("metadata", false, "a metadata informer (PartialObjectMetadata)")
	duration := flag.Duration("duration", 0, "exit after this long (0: until stdin EOF or SIGTERM)")
	events := flag.Bool("events", false, "print each event handler call on stderr")
	flag.Parse()
	if *server == "" {
		fmt.Fprintln(os.Stderr, "--server is required")
		os.Exit(2)
	}

	// The gate as client-go sees it (env KUBE_FEATURE_WatchListClient).
	fmt.Fprintf(os.Stderr, "WatchListClient=%t\n", clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient))
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/client-go" {
				fmt.Fprintf(os.Stderr, "client-go=%s\n", dep.Version)
			}
		}
	}

	var obj runtime.Object
	switch *resource {
	case "configmaps":
		obj = &corev1.ConfigMap{}
	case "pods":
		obj = &corev1.Pod{}
	default:
		fmt.Fprintf(os.Stderr, "unknown --resource %q\n", *resource)
		os.Exit(2)
	}

	cfg := &rest.Config{Host: *server, QPS: -1}
	if *protobuf {
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	var informer cache.SharedIndexInformer
	if *metadataOnly {
		mc, err := metadata.NewForConfig(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "metadata client:", err)
			os.Exit(1)
		}
		gvr := schema.GroupVersionResource{Version: "v1", Resource: *resource}
		informer = metadatainformer.NewFilteredMetadataInformer(mc, gvr, *namespace, 0, cache.Indexers{}, nil).Informer()
	} else {
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			os.Exit(1)
		}
		lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), *resource, *namespace, fields.Everything())
		informer = cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	}

	if *events {
		rv := func(o interface{}) (string, string) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			m, err := meta.Accessor(o)
			if err != nil {
				return "?", "?"
			}
			return m.GetName(), m.GetResourceVersion()
		}
		var evMu sync.Mutex
		_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(o interface{}) {
				n, v := rv(o)
				evMu.Lock()
				defer evMu.Unlock()
				fmt.Fprintf(os.Stderr, "EVENT ADD %s %s\n", n, v)
			},
			UpdateFunc: func(old, o interface{}) {
				_, ov := rv(old)
				n, v := rv(o)
				evMu.Lock()
				defer evMu.Unlock()
				fmt.Fprintf(os.Stderr, "EVENT UPDATE %s %s %s\n", n, ov, v)
			},
			DeleteFunc: func(o interface{}) {
				n, v := rv(o)
				evMu.Lock()
				defer evMu.Unlock()
				fmt.Fprintf(os.Stderr, "EVENT DELETE %s %s\n", n, v)
			},
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "event handler:", err)
			os.Exit(1)
		}
	}

	stop := make(chan struct{})
	go informer.Run(stop)
	go func() {
		if cache.WaitForCacheSync(stop, informer.HasSynced) {
			fmt.Fprintln(os.Stderr, "SYNCED")
		}
	}()

	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	dump := func(end bool) {
		outMu.Lock()
		defer outMu.Unlock()
		var entries []entry
		for _, o := range informer.GetStore().List() {
			m, err := meta.Accessor(o)
			if err != nil {
				continue
			}
			entries = append(entries, entry{m.GetNamespace(), m.GetName(), m.GetResourceVersion()})
		}
		sort.Slice(entries, func(i, j int) bool {
			if entries[i].Namespace != entries[j].Namespace {
				return entries[i].Namespace < entries[j].Namespace
			}
			return entries[i].Name < entries[j].Name
		})
		enc := json.NewEncoder(out)
		for _, e := range entries {
			_ = enc.Encode(e)
		}
		if end {
			fmt.Fprintln(out, "END")
		}
		_ = out.Flush()
	}

	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }

	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "DUMP" {
				dump(true)
			}
		}
		finish()
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		finish()
	}()
	if *duration > 0 {
		go func() {
			time.Sleep(*duration)
			finish()
		}()
	}

	<-done
	close(stop)
	dump(false)
	os.Exit(0)
}
