/* A stand-in for a release's kubeadm: answers only
 * `kubeadm config images list --kubernetes-version V -o json`, in the shape
 * of kubeadm's output API (output.kubeadm.k8s.io/v1alpha3, kind Images),
 * with kubeadm v1.31's set for v1.31.x (the demo's release), else an image
 * set a version kiln's table does not know would bring. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *version = NULL;
    int json = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--kubernetes-version")) version = argv[i + 1];
        if (!strcmp(argv[i], "-o") && !strcmp(argv[i + 1], "json")) json = 1;
    }
    if (argc < 4 || strcmp(argv[1], "config") || strcmp(argv[2], "images") ||
        strcmp(argv[3], "list") || !version || !json) {
        fprintf(stderr, "stand-in kubeadm: only config images list -o json\n");
        return 2;
    }
    const char *cp[] = {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"};
    printf("{\"kind\":\"Images\",\"apiVersion\":\"output.kubeadm.k8s.io/v1alpha3\",\"images\":[");
    for (int i = 0; i < 4; i++) printf("\"registry.k8s.io/%s:%s\",", cp[i], version);
    if (!strncmp(version, "v1.31.", 6))
        printf("\"registry.k8s.io/coredns/coredns:v1.11.3\",\"registry.k8s.io/pause:3.10\","
               "\"registry.k8s.io/etcd:3.5.15-0\"]}\n");
    else
        printf("\"registry.k8s.io/coredns/coredns:v1.99.0\",\"registry.k8s.io/pause:3.99\","
               "\"registry.k8s.io/etcd:3.99.0-0\"]}\n");
    return 0;
}
