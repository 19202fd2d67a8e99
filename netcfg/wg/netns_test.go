package wg_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// lab is one WireGuard test: its key files, the userspace host, and every
// piece of text the product produced (logs, plans, status JSON, errors),
// which must never contain a private or preshared key.
type lab struct {
	t       *testing.T
	dir     string
	us      *wg.Userspace
	mu      sync.Mutex
	out     bytes.Buffer
	secrets []string
	log     *slog.Logger
}

func newLab(t *testing.T) *lab {
	testenv.RequireRoot(t)
	l := &lab{t: t, dir: t.TempDir()}
	l.log = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug - 8}))
	l.us = wg.NewUserspace(l.log)
	t.Cleanup(l.us.Close)
	t.Cleanup(l.checkNoSecrets)
	return l
}

func (l *lab) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Write(p)
}

func (l *lab) record(s string) { l.Write([]byte(s + "\n")) }

// checkNoSecrets greps everything the product printed for every key the
// test made.
func (l *lab) checkNoSecrets() {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.out.String()
	if out == "" {
		l.t.Error("no product output was recorded: the key check proves nothing")
	}
	for _, s := range l.secrets {
		if strings.Contains(out, s) {
			l.t.Errorf("a private or preshared key appears in logs, plans, status or errors")
		}
	}
}

// key writes a fresh private key file (mode 0600) and returns its path and
// public key.
func (l *lab) key(name string) (string, wgtypes.Key) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		l.t.Fatal(err)
	}
	l.secrets = append(l.secrets, k.String())
	path := filepath.Join(l.dir, name+".key")
	if err := os.WriteFile(path, []byte(k.String()+"\n"), 0o600); err != nil {
		l.t.Fatal(err)
	}
	return path, k.PublicKey()
}

// psk writes a preshared key file.
func (l *lab) psk(name string) string {
	k, err := wgtypes.GenerateKey()
	if err != nil {
		l.t.Fatal(err)
	}
	l.secrets = append(l.secrets, k.String())
	path := filepath.Join(l.dir, name+".psk")
	if err := os.WriteFile(path, []byte(k.String()+"\n"), 0o600); err != nil {
		l.t.Fatal(err)
	}
	return path
}

// handle returns a wg.Handle on ns hosting userspace devices in this process.
func (l *lab) handle(ns *testenv.NetNS) *wg.Handle {
	h := &wg.Handle{Host: ns.Host, Userspace: l.us, Log: l.log}
	l.t.Cleanup(h.Close)
	return h
}

// desired parses yaml as nodeagent.yaml (with file checks: the key files
// are real) and derives the WireGuard desired state.
func (l *lab) desired(yaml string) wg.Desired {
	l.t.Helper()
	c, err := config.Parse(filepath.Join(l.dir, "nodeagent.yaml"), []byte(yaml))
	if err != nil {
		l.t.Fatalf("config:\n%v", err)
	}
	return wgDesired(l.t, c, nil)
}

// wgDesired is netcfg's derivation of c, the WireGuard part.
func wgDesired(t testing.TB, c *config.Config, cache *register.Cache) wg.Desired {
	t.Helper()
	d, err := netcfg.FromConfigCached(c, "", cache)
	if err != nil {
		t.Fatal(err)
	}
	return d.WG
}

// sync observes, plans and applies once, recording the plan, the status
// JSON and the error; it fails the test on failures unless allowFail.
func (l *lab) sync(h *wg.Handle, d wg.Desired, allowFail bool) (wg.Plan, error) {
	l.t.Helper()
	ctx := context.Background()
	o, err := wg.Observe(ctx, h, h.Host.Snapshot(), d)
	if err != nil {
		l.t.Fatalf("observe: %v", err)
	}
	p := wg.MakePlan(d, o)
	l.record(p.String())
	_, rep := wg.Apply(ctx, h, h.Host.Snapshot(), p)
	err = rep.Err()
	if err != nil {
		l.record(err.Error())
		if !allowFail {
			l.t.Fatalf("apply:\n%s\nerror: %v", p, err)
		}
	}
	l.status(h, d)
	return p, err
}

// status returns the status of d as observed now, recording its JSON.
func (l *lab) status(h *wg.Handle, d wg.Desired) []wg.DeviceState {
	l.t.Helper()
	o, err := wg.Observe(context.Background(), h, h.Host.Snapshot(), d)
	if err != nil {
		l.t.Fatalf("observe: %v", err)
	}
	st := wg.States(wg.MakePlan(d, o))
	// Keys print as base64 through their String methods, as the API's
	// JSON shows them, so the secret check below sees a leaked key.
	l.record(fmt.Sprintf("%+v", st))
	return st
}

// devName is a device name unique to this run: userspace UAPI sockets live
// in one global directory, whatever the namespace.
func devName(prefix string) string {
	var b [3]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// impls returns the implementations this kernel can test: userspace
// always, kernel where the kernel has WireGuard (the VM tier).
func impls(t *testing.T) []string {
	out := []string{wg.ImplUserspace}
	if testenv.HasModule("wireguard") {
		out = append(out, wg.ImplKernel)
	} else {
		t.Log("kernel has no wireguard: the kernel implementation is tested in the VM tier (make test-vm)")
	}
	return out
}

func eventually(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tunnelYAML is one end of a point-to-point tunnel.
func tunnelYAML(name, impl, keyFile string, port int, addr string, peer wgtypes.Key, peerIP, endpoint, psk string) string {
	s := fmt.Sprintf("wireguard:\n  - name: %s\n    implementation: %s\n    privateKeyFile: %s\n    listenPort: %d\n    addresses: [%s]\n    peers:\n      - name: far\n        publicKey: %s\n        allowedIPs: [%s]\n        endpoint: %q\n",
		name, impl, keyFile, port, addr, peer, peerIP, endpoint)
	if psk != "" {
		s += "        presharedKeyFile: " + psk + "\n"
	}
	return s
}

// TestTunnelBetweenNamespaces: two namespaces, a device in each converged
// from config, a ping across the tunnel, wg(8) sees the device and its
// peer, and the second sync writes nothing.
func TestTunnelBetweenNamespaces(t *testing.T) {
	for _, impl := range impls(t) {
		t.Run(impl, func(t *testing.T) {
			l := newLab(t)
			a, b := testenv.NewNetNS(t), testenv.NewNetNS(t)
			a.Veth(t, "eth0", b, "eth0")
			a.Exec(t, "ip", "addr", "add", "198.18.0.1/24", "dev", "eth0")
			b.Exec(t, "ip", "addr", "add", "198.18.0.2/24", "dev", "eth0")
			ka, pa := l.key("a")
			kb, pb := l.key("b")
			psk := l.psk("ab")
			na, nb := devName("wga"), devName("wgb")
			da := l.desired(tunnelYAML(na, impl, ka, 51820, "10.99.0.1/24", pb, "10.99.0.2/32", "198.18.0.2:51821", psk))
			db := l.desired(tunnelYAML(nb, impl, kb, 51821, "10.99.0.2/24", pa, "10.99.0.1/32", "198.18.0.1:51820", psk))
			ha, hb := l.handle(a), l.handle(b)

			p, _ := l.sync(ha, da, false)
			want := fmt.Sprintf("+ wireguard %s (%s, public key %s, listen port 51820, mtu 1420)\n"+
				"+ address 10.99.0.1/24 on %s\n"+
				"+ wireguard %s peer %s (far) allowed IPs 10.99.0.2/32, endpoint 198.18.0.2:51821, preshared key\n", na, impl, pa, na, na, pb)
			if p.String() != want {
				t.Errorf("plan:\n%s\nwant:\n%s", p, want)
			}
			l.sync(hb, db, false)

			a.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.99.0.2")
			show := a.Exec(t, "wg", "show", na)
			for _, w := range []string{"interface: " + na, "listening port: 51820", "peer: " + pb.String(), "endpoint: 198.18.0.2:51821", "allowed ips: 10.99.0.2/32", "latest handshake:", "preshared key: (hidden)"} {
				if !strings.Contains(show, w) {
					t.Errorf("wg show %s lacks %q:\n%s", na, w, show)
				}
			}
			st := l.status(ha, da)
			if len(st) != 1 || st[0].Impl != impl || len(st[0].Peers) != 1 || !st[0].Peers[0].Live(st[0].Time) || st[0].LivePeers() != 1 || st[0].Peers[0].RxBytes == 0 {
				t.Errorf("status: %+v", st)
			}

			// Converged: the second sync plans nothing and writes nothing.
			writes, cfg := ha.Host.Writes(), ha.ConfigWrites()
			p, _ = l.sync(ha, da, false)
			if !p.Empty() || ha.Host.Writes() != writes || ha.ConfigWrites() != cfg {
				t.Errorf("second sync: plan %q, %d netlink and %d WireGuard writes; want none", p, ha.Host.Writes()-writes, ha.ConfigWrites()-cfg)
			}

			// Teardown (an empty desired state) removes the device.
			l.sync(ha, wg.Desired{}, false)
			if out, err := a.TryExec("ip", "link", "show", na); err == nil {
				t.Errorf("%s still exists after removal from config:\n%s", na, out)
			}
		})
	}
}

// TestUnclampedPrivateKey: a private key file holding 32 random bytes
// that wg genkey would have clamped (`head -c 32 /dev/urandom | base64`)
// is taken as the device holds it. The device converges once and the
// next sync writes nothing; before, every poll saw the key read back
// clamped, "repaired" it, and logged a drift repair twice a second.
func TestUnclampedPrivateKey(t *testing.T) {
	for _, impl := range impls(t) {
		t.Run(impl, func(t *testing.T) {
			l := newLab(t)
			ns := testenv.NewNetNS(t)
			var raw [32]byte
			rand.Read(raw[:])
			raw[0] |= 7     // low bits set: clamping clears them
			raw[31] |= 0x80 // top bit set: clamping clears it
			b64 := base64.StdEncoding.EncodeToString(raw[:])
			l.secrets = append(l.secrets, b64)
			keyFile := filepath.Join(l.dir, "raw.key")
			if err := os.WriteFile(keyFile, []byte(b64+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, peer := l.key("peer")
			name := devName("wgc")
			d := l.desired(tunnelYAML(name, impl, keyFile, 51830, "10.98.0.1/24", peer, "10.98.0.2/32", "198.18.0.2:51831", ""))
			h := l.handle(ns)
			l.sync(h, d, false)
			pub := wgtypes.Key(raw).PublicKey()
			if got := strings.TrimSpace(ns.Exec(t, "wg", "show", name, "public-key")); got != pub.String() {
				t.Errorf("wg show %s public-key = %s; want %s, the key file's", name, got, pub)
			}
			writes, cfg := h.Host.Writes(), h.ConfigWrites()
			for i := 0; i < 3; i++ {
				if p, _ := l.sync(h, d, false); !p.Empty() {
					t.Errorf("sync %d after the first: plan %q; want none", i+2, p)
				}
			}
			if h.Host.Writes() != writes || h.ConfigWrites() != cfg {
				t.Errorf("3 syncs after converging: %d netlink and %d WireGuard writes; want none", h.Host.Writes()-writes, h.ConfigWrites()-cfg)
			}
			l.checkNoSecrets()
		})
	}
}
