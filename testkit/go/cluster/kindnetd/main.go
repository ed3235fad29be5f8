// A stand-in for kind's default CNI daemon, kindnetd: its module
// (github.com/aojea/kindnet) is not served by the Go module proxy here
// (403), and kind's own module carries no kindnetd since it moved out.
// It does the two things a kind cluster needs of it, as kindnetd does
// them: write this node's CNI config (ptp + host-local on the node's
// podCIDR, portmap) into /etc/cni/net.d, and route every other node's
// podCIDR via that node's InternalIP. No masquerading, no network
// policy: the cluster test reaches nothing outside the cluster.
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const confDir = "/etc/cni/net.d"

func main() {
	self := os.Getenv("NODE_NAME")
	if self == "" {
		log.Fatal("kindnetd: NODE_NAME is not set (the DaemonSet's downward API gives it)")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatalf("kindnetd: %v", err)
	}
	// kind adds the control plane's address (its "patch this file"), so
	// the daemon need not wait for kube-proxy's service rules, as kindnetd.
	if ep := os.Getenv("CONTROL_PLANE_ENDPOINT"); ep != "" {
		cfg.Host = "https://" + ep
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	for {
		if err := follow(ctx, client, self); err != nil {
			log.Printf("kindnetd: %v; watching again", err)
		}
		time.Sleep(time.Second)
	}
}

// follow lists the nodes, acts on each, then acts on every change until
// the watch ends.
func follow(ctx context.Context, client *kubernetes.Clientset, self string) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		apply(&nodes.Items[i], self)
	}
	w, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: nodes.ResourceVersion})
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if n, ok := ev.Object.(*corev1.Node); ok && ev.Type != watch.Deleted {
			apply(n, self)
		}
	}
	return fmt.Errorf("watch closed")
}

func apply(n *corev1.Node, self string) {
	if n.Spec.PodCIDR == "" {
		return
	}
	if n.Name == self {
		if err := writeConf(n.Spec.PodCIDR); err != nil {
			log.Printf("kindnetd: CNI config: %v", err)
		}
		return
	}
	var ip net.IP
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip = net.ParseIP(a.Address)
		}
	}
	_, dst, err := net.ParseCIDR(n.Spec.PodCIDR)
	if ip == nil || err != nil {
		return
	}
	if err := netlink.RouteReplace(&netlink.Route{Dst: dst, Gw: ip}); err != nil {
		log.Printf("kindnetd: route %s via %s: %v", dst, ip, err)
		return
	}
	log.Printf("kindnetd: route %s via %s (node %s)", dst, ip, n.Name)
}

// writeConf writes the config atomically: the kubelet and containerd
// read it while it may change.
func writeConf(podCIDR string) error {
	conf := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "kindnet",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state", "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": %q}]]}, "mtu": 1500},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podCIDR)
	path := filepath.Join(confDir, "10-kindnet.conflist")
	if old, err := os.ReadFile(path); err == nil && string(old) == conf {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		return err
	}
	log.Printf("kindnetd: CNI config for %s", podCIDR)
	return os.Rename(tmp, path)
}
