package sysctl

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostValue reads a key in the test process's own namespace.
func hostValue(t *testing.T, key string) string {
	t.Helper()
	names, err := parseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(pathOf(DefaultRoot, names))
	if err != nil {
		t.Fatal(err)
	}
	return normalize(string(b))
}

// nsValue reads a key in ns with sysctl(8), independently of this package.
func nsValue(t *testing.T, ns *testenv.NetNS, key string) string {
	t.Helper()
	return normalize(ns.Exec(t, "sysctl", "-n", key))
}

func assertNoop(t *testing.T, ns *testenv.NetNS, d Desired) {
	t.Helper()
	before := ns.Host.Writes()
	p, err := syncOnce(t, ns.Host, d)
	if err != nil || !p.Empty() || ns.Host.Writes() != before {
		t.Fatalf("second sync was not a no-op: plan %q, err %v, %d writes", p, err, ns.Host.Writes()-before)
	}
}

func TestSetsSysctlsInTheNamespace(t *testing.T) {
	ns := testenv.NewNetNS(t)
	hostForward := hostValue(t, "net.ipv4.ip_forward")
	d := Desired{Values: map[string]string{
		"net.ipv4.ip_forward":          "1",
		"net.ipv4.conf.all.rp_filter":  "2",
		"net.ipv6.conf.*.forwarding":   "1",
		"net.ipv4.ip_local_port_range": "20000 40000",
	}}
	if nsValue(t, ns, "net.ipv4.ip_forward") == "1" {
		t.Fatal("a fresh namespace already forwards; the test proves nothing")
	}
	p, err := syncOnce(t, ns.Host, d)
	if err != nil {
		t.Fatalf("apply:\n%s\nerror: %v", p, err)
	}
	t.Logf("plan:\n%s(%d writes: a write to conf.all.forwarding propagates, so later keys already have their value)", p, ns.Host.Writes())
	for key, want := range map[string]string{
		"net.ipv4.ip_forward":              "1",
		"net.ipv4.conf.all.rp_filter":      "2",
		"net.ipv6.conf.all.forwarding":     "1",
		"net.ipv6.conf.default.forwarding": "1",
		"net.ipv6.conf.lo.forwarding":      "1",
		"net.ipv4.ip_local_port_range":     "20000 40000",
	} {
		if got := nsValue(t, ns, key); got != want {
			t.Errorf("%s = %q in the namespace, want %q", key, got, want)
		}
	}
	assertNoop(t, ns, d)
	if got := hostValue(t, "net.ipv4.ip_forward"); got != hostForward {
		t.Fatalf("the host's own net.ipv4.ip_forward changed: %s -> %s", hostForward, got)
	}
}

// readOnlyProcSys bind-mounts /proc/sys read-only at a fresh directory in
// the test process's mount namespace and returns it. Which network
// namespace /proc/sys/net shows is decided by the thread that opens a file,
// not by the mount, so the converger still sees its own namespace there.
func readOnlyProcSys(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("/proc/sys", dir, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind-mount /proc/sys: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	// Keep the mount from propagating to peer mount namespaces.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make %s private: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
	return dir
}

func TestReadOnlyProcSys(t *testing.T) {
	ns := testenv.NewNetNS(t)
	hostForward := hostValue(t, "net.ipv4.ip_forward")
	// Give the namespace the value the host does not have, so a read that
	// resolved the wrong namespace would show.
	nsForward := map[string]string{"0": "1", "1": "0"}[hostForward]
	if _, err := syncOnce(t, ns.Host, Desired{Values: map[string]string{"net.ipv4.ip_forward": nsForward}}); err != nil {
		t.Fatal(err)
	}
	ro := readOnlyProcSys(t)

	right := Desired{Root: ro, Values: map[string]string{"net.ipv4.ip_forward": nsForward}}
	before := ns.Host.Writes()
	if p, err := syncOnce(t, ns.Host, right); err != nil || !p.Empty() || ns.Host.Writes() != before {
		t.Fatalf("right value on read-only /proc/sys: plan %q, err %v, %d writes", p, err, ns.Host.Writes()-before)
	}

	wrong := Desired{Root: ro, Values: map[string]string{"net.ipv4.ip_forward": hostForward}}
	p, err := syncOnce(t, ns.Host, wrong)
	if diff := cmp.Diff("~ sysctl net.ipv4.ip_forward "+nsForward+" -> "+hostForward+"\n", p.String()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	want := "sysctl net.ipv4.ip_forward: is " + nsForward + ", want " + hostForward + ", and it cannot be written: " + ro + " is read-only"
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, unix.EROFS) {
		t.Fatalf("want an error containing %q wrapping EROFS, got %v", want, err)
	}
	t.Logf("error: %v", err)
	if got := nsValue(t, ns, "net.ipv4.ip_forward"); got != nsForward {
		t.Fatalf("ip_forward changed through a read-only mount: %s", got)
	}
	if got := hostValue(t, "net.ipv4.ip_forward"); got != hostForward {
		t.Fatalf("the host's own net.ipv4.ip_forward changed: %s -> %s", hostForward, got)
	}
}

func TestPendingInterfaceKey(t *testing.T) {
	ns := testenv.NewNetNS(t)
	d := Desired{Values: map[string]string{
		"net.ipv4.conf.enp1s0/50.rp_filter":      "2",
		"net.ipv4.conf.enp1s0/50.src_valid_mark": "1",
		"net.ipv4.ip_forward":                    "1",
	}}
	p, err := syncOnce(t, ns.Host, d)
	want := "~ sysctl net.ipv4.ip_forward 0 -> 1\n" +
		"! sysctl net.ipv4.conf.enp1s0/50.rp_filter: pending: no such key yet (interface enp1s0.50 not present)\n" +
		"! sysctl net.ipv4.conf.enp1s0/50.src_valid_mark: pending: no such key yet (interface enp1s0.50 not present)\n"
	if diff := cmp.Diff(want, p.String()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	if !isPending(err) || !strings.Contains(err.Error(), "sysctl net.ipv4.conf.enp1s0/50.rp_filter: pending") {
		t.Fatalf("want a pending error naming the key, got %v", err)
	}
	if got := nsValue(t, ns, "net.ipv4.ip_forward"); got != "1" {
		t.Fatalf("the other key was not applied: ip_forward = %s", got)
	}

	// A key that does not exist and names no interface is an error, not
	// pending.
	_, err = syncOnce(t, ns.Host, Desired{Values: map[string]string{"net.ipv4.ip_forwarding": "1"}})
	if err == nil || isPending(err) || !strings.Contains(err.Error(), "sysctl net.ipv4.ip_forwarding: no such key") {
		t.Fatalf("want a plain no-such-key error, got %v", err)
	}

	// Once the interface exists (the link subsystem would create a VLAN;
	// a veth stands in for it here) the next sync sets it.
	la := netlink.NewLinkAttrs()
	la.Name = "enp1s0.50"
	if err := ns.NL.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "peer50"}); err != nil {
		t.Fatal(err)
	}
	if p, err := syncOnce(t, ns.Host, d); err != nil {
		t.Fatalf("apply:\n%s\nerror: %v", p, err)
	}
	if got := nsValue(t, ns, "net.ipv4.conf.enp1s0/50.rp_filter"); got != "2" {
		t.Fatalf("rp_filter of enp1s0.50 = %s, want 2", got)
	}
	assertNoop(t, ns, d)
}

func isPending(err error) bool {
	var pe *host.PendingError
	return errors.As(err, &pe)
}
