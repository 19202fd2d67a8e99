package dependents

import (
	"context"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netns"
)

// TestFindsPodLinks: a pod attached by Debian's macvlan CNI plugin to a
// link of the node is found from the node's namespace, on that link only;
// a macvlan of the node's own is not a dependent, nor is a pod on another
// link; after CNI DEL nothing is found.
func TestFindsPodLinks(t *testing.T) {
	testenv.RequireCNI(t)
	node, lan := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", lan, "eth0")
	node.Veth(t, "other0", lan, "eth1")
	node.Exec(t, "ip", "link", "add", "link", "trunk0", "name", "shim0", "type", "macvlan", "mode", "bridge")
	index := func(name string) int {
		l, err := node.NL.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	trunk, other := index("trunk0"), index("other0")
	find := func(parents ...int) []Link {
		t.Helper()
		got, err := Find(context.Background(), node.Handle, parents)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := find(trunk, other); len(got) != 0 {
		t.Fatalf("before any pod: %v", got)
	}
	pod := testenv.AttachPod(t, node, testenv.NAD("trunk0", "10.10.50.1", ""), "qbittorrent", "10.10.50.10/24")
	got := find(trunk, other)
	if len(got) != 1 || got[0].Parent != trunk || got[0].Name != "net1" || got[0].Kind != "macvlan" ||
		!strings.Contains(got[0].String(), pod.NS.Name) {
		t.Fatalf("with a pod on trunk0: %v, want its net1 in %s", got, pod.NS.Name)
	}
	if got := find(other); len(got) != 0 {
		t.Errorf("other0 has no pod, found %v", got)
	}
	// The same from a process in the node's namespace (netns.None()).
	var fromInside []Link
	err := node.Host.Do(func() error {
		var err error
		fromInside, err = Find(context.Background(), netns.None(), []int{trunk})
		return err
	})
	if err != nil || len(fromInside) != 1 {
		t.Errorf("from inside the node's namespace: %v %v", fromInside, err)
	}
	pod.Del(t)
	if got := find(trunk); len(got) != 0 {
		t.Errorf("after CNI DEL: %v", got)
	}
}

func TestLinkStringIsPrintable(t *testing.T) {
	l := Link{Kind: "macvlan", Name: "net\x1b[31m1", Where: "pid 7 (pa\tuse)"}
	if got, want := l.String(), "macvlan net?[31m1 in pid 7 (pa?use)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
