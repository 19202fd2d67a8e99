package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestWGPollParks: with only userspace WireGuard devices (wireguard-go in
// the daemon), nothing but another process's UAPI connection or the
// device's exit can change them, and both are signalled; so once the
// device is converged the drift poll stops waking (here it would run every
// 20 ms), and a `wg set` by hand is still repaired at once, with no poll
// timer and no resync to find it. A kernel device, which nothing signals
// for, keeps the poll ticking.
func TestWGPollParks(t *testing.T) {
	testenv.RequireRoot(t)
	for _, impl := range []string{"userspace", "kernel"} {
		t.Run(impl, func(t *testing.T) {
			if impl == "kernel" && !testenv.HasModule("wireguard") {
				t.Skip("kernel has no wireguard; this case runs in the VM tier (make test-vm)")
			}
			ns := testenv.NewNetNS(t)
			dir := t.TempDir()
			k, _ := wgtypes.GeneratePrivateKey()
			pk, _ := wgtypes.GeneratePrivateKey()
			peer := pk.PublicKey().String()
			key := filepath.Join(dir, "wg.key")
			os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
			// The UAPI sockets of userspace devices share one directory
			// whatever the namespace: a name of the test's own.
			dev := uniqueName("wgpk")
			cfg := filepath.Join(dir, "nodeagent.yaml")
			os.WriteFile(cfg, []byte(fmt.Sprintf("wireguard:\n  - name: %s\n    implementation: %s\n    privateKeyFile: %s\n    listenPort: 51820\n    peers:\n      - {name: laptop, publicKey: %s, allowedIPs: [10.90.0.2/32]}\n", dev, impl, key, peer)), 0o600)

			var polls atomic.Int64
			var parked, everParked atomic.Bool
			r := launch(t, ns, cfg, func(o *RunOptions) {
				o.Resync = time.Hour
				o.WGPoll = 20 * time.Millisecond
			}, func(d *Daemon) {
				d.polled = func(p pollResult) {
					polls.Add(1)
					if p.parked {
						everParked.Store(true)
					}
					if p.every > 0 {
						parked.Store(p.parked)
					}
				}
			})
			waitFor(t, "ready", time.Minute, func() bool { return r.d.Status().Ready })
			present := func() bool {
				out, _ := ns.TryExec("wg", "show", dev, "peers")
				return strings.Contains(out, peer)
			}
			if !present() {
				t.Fatalf("the peer is not on %s after the first sync", dev)
			}

			if impl == "kernel" {
				// Nothing changing: the poll goes on (at 20 ms, or
				// stretched to its price of a digest's dump, well under
				// a second with one peer) and never parks.
				n0 := polls.Load()
				waitFor(t, "five more polls", 20*time.Second, func() bool { return polls.Load() >= n0+5 })
				if everParked.Load() {
					t.Error("the poll of a kernel device parked; nothing would signal a wg set on it")
				}
				return
			}

			waitFor(t, "the poll to park", 10*time.Second, parked.Load)
			// The wg show above was a UAPI connection too: let the
			// polls it signalled pass first.
			time.Sleep(300 * time.Millisecond)
			n0 := polls.Load()
			time.Sleep(time.Second)
			if n := polls.Load() - n0; n != 0 {
				t.Errorf("parked, the poll still ran %d times in 1 s with nothing changing", n)
			}

			// Drift by hand: wg(8)'s UAPI connection is the signal.
			ns.Exec(t, "wg", "set", dev, "peer", peer, "remove")
			took := waitFor(t, "the peer put back", 10*time.Second, present)
			t.Logf("peer removed by hand, put back in %v with no poll timer and no resync", took.Round(time.Millisecond))
			if !strings.Contains(r.log.String(), "drift repaired") {
				t.Error("the log does not show the repair")
			}

			// And it parks again.
			waitFor(t, "the poll to park again", 10*time.Second, parked.Load)
			if s := r.d.Status(); !s.Ready || s.Degraded {
				t.Errorf("status after the repair: ready %v degraded %v", s.Ready, s.Degraded)
			}
		})
	}
}
