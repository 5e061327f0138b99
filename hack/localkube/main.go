// Command localkube is one multi-call binary holding the Kubernetes control plane Reprieve tests against:
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd and kubectl, all built from the
// official Go modules. The component runs by the first argument (or by argv[0] when invoked through a symlink).
//
//	localkube kube-apiserver --etcd-servers=... ...
//	localkube etcd --data-dir=...
//	localkube kubectl get pods
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "etcd", "kubectl"}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args
	if name == "localkube" {
		if len(os.Args) < 2 {
			fmt.Fprintf(os.Stderr, "usage: localkube <component> [flags]; components: %v\n", components)
			os.Exit(2)
		}
		name = os.Args[1]
		args = os.Args[1:]
	}
	os.Args = args
	switch name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kubectl":
		os.Exit(cli.Run(kubectlcmd.NewDefaultKubectlCommand()))
	case "etcd":
		etcdmain.Main(args)
	case "version":
		fmt.Println(version)
	default:
		fmt.Fprintf(os.Stderr, "localkube: unknown component %q; components: %v\n", name, components)
		os.Exit(2)
	}
}
