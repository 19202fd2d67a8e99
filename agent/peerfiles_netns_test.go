package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestRegisterFileChangeWritesOnePeer: with a register of 50 peers, each
// change to one file (its allowed IPs, its key, the file removed, a new
// file, a file written under a temporary name and renamed into place) is
// applied on its own: a "peers" sync that writes that one peer (two
// entries for a new key: the old one removed, the new one added), after
// which a full plan of the whole config finds nothing to do and status
// lists the device's peers as the kernel has them. A change that could
// move another file's claim (a key another file holds, a file that does
// not parse) is left to a full sync, which reports it as it always did.
func TestRegisterFileChangeWritesOnePeer(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := t.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	reg := filepath.Join(dir, "peers.d")
	os.Mkdir(reg, 0o755)
	keys := make([]wgtypes.Key, 60)
	for i := range keys {
		pk, _ := wgtypes.GeneratePrivateKey()
		keys[i] = pk.PublicKey()
	}
	file := func(i int) string { return filepath.Join(reg, fmt.Sprintf("peer%02d.yaml", i)) }
	put := func(i int, pub wgtypes.Key, allowed string) {
		t.Helper()
		if err := os.WriteFile(file(i), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [%s]\n", pub, allowed)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		put(i, keys[i], fmt.Sprintf("10.91.0.%d/32", 10+i))
	}
	dev := uniqueName("wgr")
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("wireguard:\n  - name: %s\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.91.0.1/24]\n    peersDir: %s\n", dev, key, reg)), 0o600)
	r := startDaemon(t, ns, cfg, nil)
	ctx := context.Background()

	count := func() int64 {
		if s := r.d.Status().LastSync; s != nil {
			return s.Count
		}
		return 0
	}
	// The kernel events of a sync's own writes bring a sync or two more;
	// a change merged with one of those is a full sync.
	quiet := func() {
		for last := count(); ; last = count() {
			time.Sleep(time.Second)
			if count() == last {
				return
			}
		}
	}
	quiet()
	// step makes one change and waits for the sync it brings; it returns
	// that sync and the peer entries written.
	step := func(what string, change func()) (*api.Sync, int64) {
		t.Helper()
		before, writes := count(), r.d.cv.WG().PeerWrites()
		// File times move in ticks: a change within the tick of the
		// last read would look unchanged to the cache's identity.
		time.Sleep(20 * time.Millisecond)
		change()
		waitFor(t, what+": a sync", 20*time.Second, func() bool { return count() > before })
		s := r.d.Status().LastSync
		return s, r.d.cv.WG().PeerWrites() - writes
	}
	converged := func(what string) {
		t.Helper()
		if p := r.d.Plan(ctx); len(p.Lines) != 0 || p.Error != "" {
			t.Errorf("%s: a full plan afterwards is not empty:\n%s%s", what, strings.Join(p.Lines, "\n"), p.Error)
		}
	}
	kernel := func() string { return ns.Exec(t, "wg", "show", dev, "allowed-ips") }
	statusHas := func(pub wgtypes.Key, allowed string) bool {
		for _, d := range r.d.Status().WireGuard {
			for _, p := range d.Peers {
				if p.PublicKey == pub.String() {
					return allowed == "" || strings.Join(p.AllowedIPs, ",") == allowed
				}
			}
		}
		return false
	}
	one := func(what string, wantWrites int64, change func(), check func() bool) {
		t.Helper()
		s, w := step(what, change)
		if s.Trigger != "peers" || w != wantWrites {
			t.Errorf("%s: a %q sync writing %d peer entries; want a \"peers\" sync writing %d", what, s.Trigger, w, wantWrites)
		}
		if !check() {
			t.Errorf("%s: not in the kernel or status as written; kernel:\n%s", what, kernel())
		}
		converged(what)
		t.Logf("%s: %q sync, %d peer entries written, %.2f ms", what, s.Trigger, w, s.DurationMS)
	}

	one("allowed IPs changed", 1, func() { put(7, keys[7], "10.91.1.7/32") }, func() bool {
		return strings.Contains(kernel(), keys[7].String()+"\t10.91.1.7/32") && statusHas(keys[7], "10.91.1.7/32")
	})
	one("file removed", 1, func() { os.Remove(file(8)) }, func() bool {
		return !strings.Contains(kernel(), keys[8].String()) && !statusHas(keys[8], "")
	})
	one("file added", 1, func() { put(55, keys[55], "10.91.0.155/32") }, func() bool {
		return strings.Contains(kernel(), keys[55].String()+"\t10.91.0.155/32") && statusHas(keys[55], "10.91.0.155/32")
	})
	one("key changed", 2, func() { put(9, keys[56], "10.91.0.19/32") }, func() bool {
		out := kernel()
		return !strings.Contains(out, keys[9].String()) && strings.Contains(out, keys[56].String()+"\t10.91.0.19/32") && statusHas(keys[56], "")
	})
	one("written under a temporary name and renamed", 1, func() {
		tmp := filepath.Join(reg, ".peer10.yaml.tmp")
		os.WriteFile(tmp, []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.91.1.10/32]\n", keys[10])), 0o644)
		os.Rename(tmp, file(10))
	}, func() bool { return strings.Contains(kernel(), keys[10].String()+"\t10.91.1.10/32") })

	one("renamed (the same peer in another file)", 0, func() {
		os.Rename(file(14), filepath.Join(reg, "peer14-laptop.yaml"))
	}, func() bool { return strings.Contains(kernel(), keys[14].String()+"\t10.91.0.24/32") })

	// Another file's key: a full sync, which skips the later file.
	s, _ := step("a clashing key", func() { put(57, keys[11], "10.91.0.157/32") })
	if s.Trigger != "config" {
		t.Errorf("a key another file holds: a %q sync; want a full (config) one", s.Trigger)
	}
	if c := r.d.condition(api.CondPeersConfigured); c == nil || c.Status != api.False || !strings.Contains(c.Message, "peer57.yaml") {
		t.Errorf("PeersConfigured is %+v; want False naming peer57.yaml", c)
	}
	s, _ = step("the clash removed", func() { os.Remove(file(57)) })
	if s.Trigger != "config" {
		// The device had a skipped entry: only a full sync can tell what
		// its removal lets in.
		t.Errorf("removing a skipped file: a %q sync; want a full one", s.Trigger)
	}
	converged("the clash removed")
	// A file that does not parse: a full sync reports it.
	s, _ = step("a broken file", func() { os.WriteFile(file(58), []byte("publicKey: [\n"), 0o644) })
	if s.Trigger != "config" {
		t.Errorf("a broken file: a %q sync; want a full one", s.Trigger)
	}
	os.Remove(file(58))
	waitFor(t, "the broken file's removal synced", 20*time.Second, func() bool {
		c := r.d.condition(api.CondPeersConfigured)
		return c != nil && c.Status == api.True
	})
	// Once clean again, single files go the short way again.
	one("allowed IPs changed again", 1, func() { put(12, keys[12], "10.91.1.12/32") }, func() bool {
		return strings.Contains(kernel(), keys[12].String()+"\t10.91.1.12/32")
	})
	// A file beside the peers that is not a peer file (a preshared key a
	// peer may name): a full sync.
	s, _ = step("a key file beside the peers", func() { os.WriteFile(filepath.Join(reg, "alice.psk"), []byte("x\n"), 0o600) })
	if s.Trigger != "config" {
		t.Errorf("a key file beside the peers: a %q sync; want a full one", s.Trigger)
	}
	// Safe apply: a probe whose traffic leaves through the device (an
	// address of its own subnet) makes every peer change a full sync,
	// with the probes around it; one that does not, does not.
	base, _ := os.ReadFile(cfg)
	for _, c := range []struct {
		target, want string
	}{{"10.91.0.200", "config"}, {"127.0.0.1", "peers"}} {
		step("checks.arpReachable "+c.target, func() {
			os.WriteFile(cfg, append(base, fmt.Sprintf("checks:\n  gatewayARP: false\n  arpReachable: [%s]\n", c.target)...), 0o600)
		})
		quiet()
		s, _ := step("a peer change with a probe to "+c.target, func() { put(13, keys[13], "10.91.1.13/32") })
		if s.Trigger != c.want {
			t.Errorf("a probe to %s: a %q sync; want %q", c.target, s.Trigger, c.want)
		}
		put(13, keys[13], "10.91.0.23/32")
	}
}
