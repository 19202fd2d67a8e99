package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestQuietResync: a resync with nothing changed in the watched
// directories reads only the config and keeps the desired state; a
// change the watch sees (a preshared key file rewritten in place, which
// wakes no sync of its own) is read by the next resync, and so is a
// config reached through a link whose target changed (the config is
// always compared), and a key file whose directory's link was pointed
// elsewhere (the directories read are stat'ed again); a change no watch can see (a register file written
// through a hard link from an unwatched directory) is read by the
// fullEvery-th resync at the latest. A register directory replaced by a
// new one is read whole by the resync after the reload its events bring
// (the new directory's watch began after that reload read it).
func TestQuietResync(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir, real, outside := t.TempDir(), t.TempDir(), t.TempDir()
	// The private key is reached through a link to a directory, in a
	// directory nobody watches: pointing the link elsewhere raises no
	// event in a watched directory.
	k, _ := wgtypes.GeneratePrivateKey()
	k2, _ := wgtypes.GeneratePrivateKey()
	unwatched := t.TempDir()
	for i, kk := range []wgtypes.Key{k, k2} {
		kd := filepath.Join(unwatched, fmt.Sprint("k", i))
		os.Mkdir(kd, 0o700)
		os.WriteFile(filepath.Join(kd, "wg.key"), []byte(kk.String()+"\n"), 0o600)
	}
	os.Symlink("k0", filepath.Join(unwatched, "cur"))
	key := filepath.Join(unwatched, "cur", "wg.key")
	keys := filepath.Join(dir, "keys")
	os.Mkdir(keys, 0o700)
	psk := filepath.Join(keys, "b.psk")
	psk1, _ := wgtypes.GenerateKey()
	os.WriteFile(psk, []byte(psk1.String()+"\n"), 0o600)
	reg := filepath.Join(dir, "peers.d")
	os.Mkdir(reg, 0o755)
	ka, _ := wgtypes.GeneratePrivateKey()
	kb, _ := wgtypes.GeneratePrivateKey()
	a, b := ka.PublicKey(), kb.PublicKey()
	// a.yaml is a hard link to a file in a directory nobody watches.
	linked := filepath.Join(outside, "a.yaml")
	os.WriteFile(linked, []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.92.0.10/32]\n", a)), 0o644)
	if err := os.Link(linked, filepath.Join(reg, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(reg, "b.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.92.0.11/32]\npresharedKeyFile: %s\n", b, psk)), 0o644)
	dev := uniqueName("wgq")
	body := func(port int) []byte {
		return []byte(fmt.Sprintf("wireguard:\n  - name: %s\n    privateKeyFile: %s\n    listenPort: %d\n    addresses: [10.92.0.1/24]\n    peersDir: %s\n", dev, key, port, reg))
	}
	// The config is a link to a file elsewhere, as a ConfigMap mount makes it.
	target := filepath.Join(real, "nodeagent.yaml")
	os.WriteFile(target, body(51820), 0o600)
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.Symlink(target, cfg)

	type load struct {
		quiet   bool
		allowed string // peer a's allowed IPs in the desired state
		psk     wgtypes.Key
		port    int
		priv    wgtypes.Key
	}
	var mu sync.Mutex
	var loads []load
	// brief says of each load whether it was quiet and what peer a had.
	brief := func(ls []load) string {
		var b strings.Builder
		for _, l := range ls {
			fmt.Fprintf(&b, "[quiet %v, a %s, port %d] ", l.quiet, l.allowed, l.port)
		}
		return b.String()
	}
	launch(t, ns, cfg, func(o *RunOptions) { o.Resync = 300 * time.Millisecond }, func(d *Daemon) {
		d.onLoad = func(quiet bool) {
			l := load{quiet: quiet}
			for _, wd := range d.desired.WG.Devices {
				l.port, l.priv = wd.ListenPort, wgtypes.Key(wd.PrivateKey)
				for _, p := range wd.Peers {
					switch p.PublicKey {
					case a:
						l.allowed = fmt.Sprint(p.AllowedIPs)
					case b:
						l.psk = wgtypes.Key(p.PresharedKey)
					}
				}
			}
			mu.Lock()
			loads = append(loads, l)
			mu.Unlock()
		}
	})
	since := func(i int) []load {
		mu.Lock()
		defer mu.Unlock()
		return append([]load(nil), loads[min(i, len(loads)):]...)
	}
	mark := func() int { mu.Lock(); defer mu.Unlock(); return len(loads) }
	// first is the index in ls of the first load for which ok holds.
	first := func(ls []load, ok func(load) bool) int {
		for i, l := range ls {
			if ok(l) {
				return i
			}
		}
		return -1
	}

	waitFor(t, "two quiet resyncs in a row", 20*time.Second, func() bool {
		ls := since(0)
		n := len(ls)
		return n >= 2 && ls[n-1].quiet && ls[n-2].quiet
	})

	// No watch sees this: the quiet resyncs keep the old allowed IPs, and
	// a full one (within fullEvery resyncs) takes the new.
	m := mark()
	os.WriteFile(linked, []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.92.1.10/32]\n", a)), 0o644)
	waitFor(t, "the kernel to have the hard-linked file's change", 20*time.Second, func() bool {
		return strings.Contains(ns.Exec(t, "wg", "show", dev, "allowed-ips"), a.String()+"\t10.92.1.10/32")
	})
	ls := since(m)
	at := first(ls, func(l load) bool { return l.allowed == "[10.92.1.10/32]" })
	if at < 0 || ls[at].quiet {
		t.Fatalf("the change was taken by no full load: %s", brief(ls))
	}
	if at == 0 || !ls[0].quiet || at > fullEvery {
		t.Errorf("want quiet resyncs keeping the old allowed IPs, then a full one within %d; loads since the change: %s", fullEvery, brief(ls))
	}

	// The psk file's directory is watched: its change is read by the next
	// resync (or one after, if one began as the file was written or the
	// event reached the watch late).
	m = mark()
	psk2, _ := wgtypes.GenerateKey()
	os.WriteFile(psk, []byte(psk2.String()+"\n"), 0o600)
	waitFor(t, "the kernel to have the new preshared key", 20*time.Second, func() bool {
		return strings.Contains(ns.Exec(t, "wg", "show", dev, "preshared-keys"), b.String()+"\t"+psk2.String())
	})
	ls = since(m)
	if at := first(ls, func(l load) bool { return l.psk == psk2 }); at < 0 || at > 2 || ls[at].quiet {
		t.Errorf("the preshared key file's change: want it read by a full load within three resyncs (the event may reach the watch late on a busy machine); loads since: %s", brief(ls))
	}

	// The register directory replaced by a new one: the reload its
	// events bring reads it, and since the watch on the new directory
	// began after that read, the resync after it reads everything too.
	m = mark()
	fresh := reg + ".new"
	os.Mkdir(fresh, 0o755)
	kc, _ := wgtypes.GeneratePrivateKey()
	os.WriteFile(filepath.Join(fresh, "c.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.92.0.12/32]\n", kc.PublicKey())), 0o644)
	os.RemoveAll(reg)
	os.Rename(fresh, reg)
	waitFor(t, "the kernel to have the new directory's peer", 20*time.Second, func() bool {
		out := ns.Exec(t, "wg", "show", dev, "allowed-ips")
		return strings.Contains(out, kc.PublicKey().String()) && !strings.Contains(out, a.String())
	})
	waitFor(t, "two loads after the new directory's", 20*time.Second, func() bool { return len(since(m)) >= 3 })
	ls = since(m)
	if at := first(ls, func(l load) bool { return l.allowed == "" }); at < 0 || ls[at].quiet || at+1 >= len(ls) || ls[at+1].quiet {
		t.Errorf("the register directory replaced: want a full load of it and a full resync after; loads since: %s", brief(ls))
	}

	// The key directory's link pointed elsewhere: no event, but the
	// directory the path leads to is not the one read, so the next resync
	// reads everything.
	m = mark()
	os.Symlink("k1", filepath.Join(unwatched, "cur.new"))
	os.Rename(filepath.Join(unwatched, "cur.new"), filepath.Join(unwatched, "cur"))
	waitFor(t, "the kernel to have the other private key", 20*time.Second, func() bool {
		return strings.Contains(ns.Exec(t, "wg", "show", dev, "public-key"), k2.PublicKey().String())
	})
	ls = since(m)
	if at := first(ls, func(l load) bool { return l.priv == k2 }); at < 0 || at > 1 || ls[at].quiet {
		t.Errorf("the key directory's link pointed elsewhere: want a full load at the first or second resync; loads since: %s", brief(ls))
	}

	// The link's target changed: no event in the config's directory, but
	// the config read by the next resync differs.
	m = mark()
	os.WriteFile(target, body(51821), 0o600)
	waitFor(t, "the kernel to listen on the new port", 20*time.Second, func() bool {
		return strings.Contains(ns.Exec(t, "wg", "show", dev, "listen-port"), "51821")
	})
	ls = since(m)
	if at := first(ls, func(l load) bool { return l.port == 51821 }); at < 0 || at > 1 || ls[at].quiet {
		t.Errorf("the config's target changed: want it read by a full load at the first or second resync; loads since: %s", brief(ls))
	}
}
