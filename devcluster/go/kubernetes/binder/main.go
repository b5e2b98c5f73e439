// bench-binder binds every pending pod of one namespace to the nodes round-robin, with no
// scheduling decision at all. bench/compare.py runs it beside the schedulers as the ceiling:
// how many bindings per second this API server accepts from a client with the same QPS and
// burst. It speaks protobuf, as kube-scheduler does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "", "namespace whose pending pods to bind")
	qps := flag.Float64("qps", 200, "client QPS (0: no limit)")
	burst := flag.Int("burst", 400, "client burst")
	workers := flag.Int("workers", 16, "concurrent bindings")
	flag.Parse()
	if *kubeconfig == "" || *namespace == "" {
		fmt.Fprintln(os.Stderr, "bench-binder: --kubeconfig and --namespace are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-binder: %v\n", err)
		os.Exit(1)
	}
	config.QPS = float32(*qps)
	if *qps <= 0 {
		config.QPS = -1 // client-go: no rate limiter
	}
	config.Burst = *burst
	config.ContentType = "application/vnd.kubernetes.protobuf"
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-binder: %v\n", err)
		os.Exit(1)
	}
	ctx := context.Background()
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		fmt.Fprintf(os.Stderr, "bench-binder: no nodes to bind to (%v)\n", err)
		os.Exit(1)
	}
	pods, err := client.CoreV1().Pods(*namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-binder: listing pods: %v\n", err)
		os.Exit(1)
	}
	var pending []string
	for _, pod := range pods.Items {
		if pod.Spec.NodeName == "" {
			pending = append(pending, pod.Name)
		}
	}
	work := make(chan int)
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				binding := &corev1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: pending[i], Namespace: *namespace},
					Target:     corev1.ObjectReference{Kind: "Node", Name: nodes.Items[i%len(nodes.Items)].Name},
				}
				if err := client.CoreV1().Pods(*namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
					failed.Add(1)
					fmt.Fprintf(os.Stderr, "bench-binder: %s: %v\n", pending[i], err)
				}
			}
		}()
	}
	for i := range pending {
		work <- i
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	fmt.Printf("bench-binder: %d bindings (%d failed) in %.1f s\n", len(pending), failed.Load(), elapsed)
	if failed.Load() > 0 {
		os.Exit(1)
	}
}
