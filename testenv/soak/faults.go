package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gopkg.in/yaml.v3"
)

// nemesis makes the faults. Each is made as the tests that prove the
// daemon survives it one at a time make it:
//
//	kill9                cmd/nodeagent TestKillNineDaemon, TestPIAKillNineAndRestart
//	sighup-storm         agent TestMergeOperatorReload, TestReloadAppliesASaveInAnyOrder
//	reload-storm         cmd/nodeagentctl's reload, agent TestKicksKeepEveryTrigger
//	save-*               agent TestBadSaveNeverTearsDown, TestBrokenReloadIsRejectedWhole
//	peer-*               agent TestRegisterFileChangeWritesOnePeer, TestBadPeerFileStillReady
//	del-*, link-down,    agent TestDriftRepairedFromEvents, TestEventStormDoesNotStarveRepairs,
//	  sysctl, del-peer     TestCoexistenceNamesNetworkd (networkd's deletions)
//	flood                agent TestEventStormDoesNotStarveRepairs
//	pia-*                piastub's faults: TestPIARestart, TestPIAServerFailover,
//	                       TestPIARetryAfter, TestPIASlowAPI, TestPIAPortForwardFaults
//	kube-*               agent TestLabelsNeverBlockNetworking
//	clock-step           netcfg/wg/pia TestClock* (a stepped wall clock)
//	state-*              netcfg TestTeardown* (a read-only state directory)
//	hook-*               agent TestPortHookRetriesUntilDelivered, cmd/nodeagent TestStopEndsAHangingHook
type nemesis struct {
	lab    *Lab
	sup    *supervisor
	client *api.Client
	mon    *monitor
	logf   func(format string, a ...any)

	// configBad: the config file on disk does not validate (a rejected
	// save): a daemon started now exits, as it should.
	configBad atomic.Bool
}

// errSkipped is a fault that could not be made now (what it needs is not
// there): logged, not a violation.
type errSkipped struct{ why string }

func (e errSkipped) Error() string { return "skipped: " + e.why }

// run makes fault f: begins it, lets it last f.For, ends it.
func (n *nemesis) run(ctx context.Context, f Fault) error {
	begin, end, err := n.fault(ctx, f)
	if err != nil {
		return err
	}
	if begin != nil {
		if err := begin(); err != nil {
			return err
		}
	}
	if f.For > 0 {
		select {
		case <-time.After(f.For):
		case <-ctx.Done():
		}
	}
	if end != nil {
		return end()
	}
	return nil
}

// fault returns what begins and ends f.
func (n *nemesis) fault(ctx context.Context, f Fault) (begin, end func() error, err error) {
	l := n.lab
	node := l.Node
	sh := func(lines ...string) func() error {
		return func() error {
			for _, line := range lines {
				if out, err := nsRun(node, strings.Fields(line)...); err != nil {
					return fmt.Errorf("%s: %v: %s", line, err, strings.TrimSpace(out))
				}
			}
			return nil
		}
	}
	switch f.Kind {
	case "kill9":
		return func() error {
			release, ok := n.sup.Kill(syscall.SIGKILL)
			n.mon.killed(ok)
			time.AfterFunc(f.For, release)
			if !ok {
				return errSkipped{"no daemon running"}
			}
			return nil
		}, nil, nil
	case "sighup-storm":
		count := []int{5, 20, 50}[f.Arg]
		return func() error {
			for range count {
				n.sup.Signal(syscall.SIGHUP)
				time.Sleep(f.For / time.Duration(count))
			}
			return nil
		}, nil, nil
	case "reload-storm":
		count := []int{3, 10, 20}[f.Arg]
		return func() error {
			var wg sync.WaitGroup
			for i := range count {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(f.For / time.Duration(count) * time.Duration(i))
					rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					n.client.Reload(rctx)
				}()
			}
			wg.Wait()
			return nil
		}, nil, nil
	case "save-good":
		edit := []func(*yaml.Node){n.addLabel(f.N), addRoute, n.dropVLAN49}[f.Arg%3]
		inPlace := f.Arg < 3
		b, err := editConfig(l.Good, edit)
		if err != nil {
			return nil, nil, err
		}
		return func() error { return n.save(b, inPlace) }, func() error { return n.save(l.Good, inPlace) }, nil
	case "save-held":
		edit := []func(*yaml.Node){killSwitchesOff, labelsGone, rulesGone}[f.Arg]
		b, err := editConfig(l.Good, edit)
		if err != nil {
			return nil, nil, err
		}
		return func() error { return n.save(b, false) }, func() error { return n.save(l.Good, false) }, nil
	case "save-rejected":
		var b []byte
		switch f.Arg {
		case 0:
			b = append([]byte("vlans:\n  - {name: enp1s0.4095, parent: enp1s0, id: 4095}\n"), l.Good...)
			if !l.P.StandIn {
				b = bytes.Replace(l.Good, []byte("vlans:\n"), []byte("vlans:\n  - {name: enp1s0.4095, parent: enp1s0, id: 4095}\n"), 1)
			}
		case 1:
			b = append(append([]byte{}, l.Good...), "frobnicate: true\n"...)
		case 2:
			b = nil
		}
		return func() error {
				n.configBad.Store(true)
				return n.save(b, true)
			}, func() error {
				err := n.save(l.Good, true)
				n.configBad.Store(false)
				return err
			}, nil
	case "peer-add":
		key, _ := wgtypes.GeneratePrivateKey()
		path := filepath.Join(l.PeersDir, fmt.Sprintf("soak-%d.yaml", f.N))
		body := fmt.Sprintf("name: soak-%d\npublicKey: %s\nallowedIPs: [10.90.0.%d/32]\n", f.N, key.PublicKey(), 10+f.N%100)
		return func() error { return os.WriteFile(path, []byte(body), 0o644) }, func() error { return os.Remove(path) }, nil
	case "peer-broken":
		if f.Arg == 0 {
			path := filepath.Join(l.PeersDir, fmt.Sprintf("soak-broken-%d.yaml", f.N))
			return func() error { return os.WriteFile(path, []byte("publicKey: [[[\nallowedIPs: 10.90.0.300/32\n"), 0o644) },
				func() error { return os.Remove(path) }, nil
		}
		path := filepath.Join(l.PeersDir, "phone.yaml")
		return func() error { return os.WriteFile(path, []byte("name: phone\npublicKey: not-a-key\n"), 0o644) },
			func() error { return os.WriteFile(path, l.clientFiles["phone.yaml"], 0o644) }, nil
	case "peer-remove":
		name := []string{"phone.yaml", "laptop.conf"}[f.Arg]
		path := filepath.Join(l.PeersDir, name)
		return func() error { return os.Remove(path) }, func() error { return os.WriteFile(path, l.clientFiles[name], 0o644) }, nil
	case "del-nft-table":
		return n.deleting(layerNFT, sh("nft delete table inet nodeagent")), nil, nil
	case "del-nft-chain":
		if f.Arg == 0 {
			return n.deleting(layerNFT, sh("nft flush chain inet nodeagent forward")), nil, nil
		}
		return n.deleting(layerNFT, func() error {
			_, err := nsRunStdin(node.Host, "flush chain inet nodeagent postrouting\ndelete chain inet nodeagent postrouting\n", "nft", "-f", "-")
			return err
		}), nil, nil
	case "del-rule":
		prio := []int{1000, 1002}[f.Arg]
		return n.deleting(layerRules, func() error {
			rules, err := node.NL.RuleList(netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			deleted := 0
			for _, r := range rules {
				if r.Priority == prio {
					if err := node.NL.RuleDel(&r); err == nil {
						deleted++
					}
				}
			}
			if deleted == 0 {
				return errSkipped{fmt.Sprintf("no rule %d", prio)}
			}
			return nil
		}), nil, nil
	case "del-routes":
		return n.deleting(layerRoutes, func() error {
			routes, err := node.NL.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 150}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			deleted := 0
			for _, r := range routes {
				if r.Protocol != 147 {
					continue // another manager's, and never ours to touch
				}
				if f.Arg == 1 && !(r.Dst == nil || r.Dst.IP.IsUnspecified()) {
					continue
				}
				if node.NL.RouteDel(&r) == nil {
					deleted++
				}
			}
			if deleted == 0 {
				return errSkipped{"no route in table 150"}
			}
			return nil
		}), nil, nil
	case "del-addr":
		if f.Arg == 0 {
			return sh("ip addr del " + shimAddr + "/24 dev vlan50-shim"), nil, nil
		}
		return sh("ip addr del 10.10.49.10/24 dev " + l.P.vlan49()), nil, nil
	case "del-link":
		return sh("ip link del " + []string{"vlan50-shim", l.P.vlan49()}[f.Arg]), nil, nil
	case "link-down":
		return sh("ip link set " + []string{"vlan50-shim", l.P.VLAN()}[f.Arg] + " down"), nil, nil
	case "del-peer":
		key := []wgtypes.Key{l.phoneKey, l.laptopKey}[f.Arg].PublicKey()
		return func() error {
			return node.Host.Do(func() error {
				c, err := wgctrl.New()
				if err != nil {
					return err
				}
				defer c.Close()
				return c.ConfigureDevice(l.P.WG0Dev, wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: key, Remove: true}}})
			})
		}, nil, nil
	case "del-wgpia":
		return sh("ip link del " + l.P.PIADev), nil, nil
	case "sysctl":
		key := []string{"net/ipv4/ip_forward", "net/ipv4/conf/vlan50-shim/rp_filter"}[f.Arg]
		value := []string{"0", "1"}[f.Arg]
		return func() error {
			return node.Host.Do(func() error { return os.WriteFile("/proc/sys/"+key, []byte(value), 0o644) })
		}, nil, nil
	case "flood":
		var stop atomic.Bool
		done := make(chan struct{})
		return func() error {
				go func() {
					defer close(done)
					for i := 0; !stop.Load(); i++ {
						if f.Arg == 0 {
							if link, err := node.NL.LinkByName("vlan50-shim"); err == nil {
								node.NL.LinkSetTxQLen(link, 1000+i%2)
							}
						} else if link, err := node.NL.LinkByName(l.floodA); err == nil {
							if i%2 == 0 {
								node.NL.LinkSetDown(link)
							} else {
								node.NL.LinkSetUp(link)
							}
						}
						time.Sleep(10 * time.Millisecond)
					}
					if link, err := node.NL.LinkByName(l.floodA); err == nil {
						node.NL.LinkSetUp(link)
					}
				}()
				return nil
			}, func() error {
				stop.Store(true)
				<-done
				return nil
			}, nil
	case "pia-restart":
		return func() error {
			srv, err := n.serverInUse(ctx)
			if err != nil {
				return err
			}
			srv.Restart()
			return nil
		}, nil, nil
	case "pia-udp", "pia-down":
		var srv *piastub.Server
		return func() error {
				var err error
				if srv, err = n.serverInUse(ctx); err != nil {
					return err
				}
				if f.Kind == "pia-udp" {
					srv.StopUDP()
				} else {
					srv.Down()
				}
				return nil
			}, func() error {
				srv.Up()
				return nil
			}, nil
	case "pia-429":
		ra := []string{"", "5", "30", "0"}[f.Arg]
		return func() error {
				l.Stub.TokenStatus(429, ra)
				if f.Arg == 3 {
					l.Stub.ExpireTokens()
				}
				return nil
			}, func() error {
				l.Stub.TokenStatus(0, "")
				return nil
			}, nil
	case "pia-500":
		return func() error {
				l.Stub.TokenStatus(500, "")
				if f.Arg == 1 {
					l.Stub.ExpireTokens()
				}
				return nil
			}, func() error {
				l.Stub.TokenStatus(0, "")
				return nil
			}, nil
	case "pia-slow":
		d := []time.Duration{2 * time.Second, 5 * time.Second, 9 * time.Second}[f.Arg]
		return func() error { l.Stub.Slow(d); return nil }, func() error { l.Stub.Slow(0); return nil }, nil
	case "pia-bind":
		return func() error {
				switch f.Arg {
				case 0:
					l.Stub.RefuseBinds(true)
				case 1:
					l.Stub.BindUnauthorized(2)
				case 2:
					srv, err := n.serverInUse(ctx)
					if err != nil {
						return err
					}
					srv.BusyNext(2)
				}
				return nil
			}, func() error {
				l.Stub.RefuseBinds(false)
				return nil
			}, nil
	case "pia-login":
		return func() error { l.Stub.LoginFailed([]int{1, 3}[f.Arg]); return nil }, nil, nil
	case "kube-stop":
		return func() error {
				l.Kube.StopAPIServer()
				return nil
			}, func() error {
				sctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				return l.Kube.StartAPIServer(sctx)
			}, nil
	case "kube-hang":
		return func() error { l.proxy.Hang(true); return nil }, func() error { l.proxy.Hang(false); return nil }, nil
	case "clock-step":
		step := []time.Duration{time.Hour, 25 * time.Hour, -10 * time.Minute, 3 * 365 * 24 * time.Hour}[f.Arg]
		return func() error { return n.stepClock(step) }, func() error { return n.stepClock(0) }, nil
	case "state-full":
		filler := filepath.Join(l.StateDir, "soak-filler")
		return func() error {
				fill(filler)
				return nil
			}, func() error {
				return os.Remove(filler)
			}, nil
	case "state-ro":
		return func() error {
				return unix.Mount("", l.StateDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
			}, func() error {
				return unix.Mount("", l.StateDir, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, "")
			}, nil
	case "hook-hang", "hook-fail":
		mode := strings.TrimPrefix(f.Kind, "hook-")
		return func() error { return os.WriteFile(l.hookMode, []byte(mode+"\n"), 0o644) },
			func() error { return os.WriteFile(l.hookMode, []byte("ok\n"), 0o644) }, nil
	}
	return nil, nil, fmt.Errorf("no fault %q", f.Kind)
}

// Kill-switch layers, each deleted alone (resKillSwitch).
const (
	layerNFT    = "nftables kill switch"
	layerRules  = "rules to table 150"
	layerRoutes = "table 150's unreachable default"
)

// deleting wraps a deletion of a kill switch's layer: it waits for the
// other layers to be back first (a daemon that is down repairs nothing,
// and the schedule's tail cannot know), then tells the monitor, which
// excuses the layer's absence for the repair bound.
func (n *nemesis) deleting(layer string, del func() error) func() error {
	return func() error {
		deadline := time.Now().Add(60 * time.Second)
		for !n.mon.layersBackBut(layer) {
			if time.Now().After(deadline) {
				return errSkipped{"the other kill-switch layers are not back after 60s"}
			}
			time.Sleep(100 * time.Millisecond)
		}
		return n.mon.deletingLayer(layer, del)
	}
}

// save writes the config, in place (truncated, then written: an editor's
// save, whose watcher may see the empty file between) or renamed over it
// (config management's).
func (n *nemesis) save(b []byte, inPlace bool) error {
	path := n.lab.Config
	if inPlace {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		return errors.Join(err, f.Close())
	}
	tmp := filepath.Join(filepath.Dir(path), ".nodeagent.yaml.soak")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// serverInUse is the stub server the tunnel is registered with.
func (n *nemesis) serverInUse(ctx context.Context) (*piastub.Server, error) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := n.client.Status(sctx)
	if err != nil {
		return nil, errSkipped{"status: " + err.Error()}
	}
	for _, t := range s.PIA {
		for _, srv := range n.lab.Stub.Servers {
			if srv.Spec.CN == t.ServerCN {
				return srv, nil
			}
		}
	}
	return nil, errSkipped{"no registration"}
}

// fill writes path until the filesystem is full.
func fill(path string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	b := make([]byte, 64<<10)
	for {
		if _, err := f.Write(b); err != nil {
			return
		}
	}
}

// stepClock steps the daemon's wall clock to run step from the machine's
// (the daemon's test hook: stepping the machine's own clock would step
// every other test on it). A daemon that starts meanwhile reads the file.
func (n *nemesis) stepClock(step time.Duration) error {
	if err := os.WriteFile(n.lab.clockFile, []byte(step.String()+"\n"), 0o644); err != nil {
		return err
	}
	// Not to a daemon still starting: it reads the file, and the signal
	// might come before it listens for it.
	if pid, started := n.sup.Pid(); pid != 0 && time.Since(started) > 3*time.Second {
		n.sup.Signal(syscall.SIGUSR1)
	}
	return nil
}

// editConfig applies edit to the config b.
func editConfig(b []byte, edit func(root *yaml.Node)) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	edit(doc.Content[0])
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (n *nemesis) addLabel(i int) func(*yaml.Node) {
	return func(root *yaml.Node) {
		if k := get(root, "kubernetes"); k != nil {
			if ls := get(k, "labels"); ls != nil {
				set(ls, "homelab.example/soak", scalar(fmt.Sprintf("save-%d", i)))
			}
		}
	}
}

func addRoute(root *yaml.Node) {
	if r := get(root, "routing"); r != nil {
		if ts := get(r, "tables"); ts != nil && len(ts.Content) > 0 {
			if rs := get(ts.Content[0], "routes"); rs != nil {
				rs.Content = append(rs.Content, mapping("to", "10.77.0.0/24", "dev", "vlan50-shim", "scope", "link"))
			}
		}
	}
}

func (n *nemesis) dropVLAN49(root *yaml.Node) {
	for _, list := range []string{"vlans", "macvlans"} {
		seq := get(root, list)
		if seq == nil {
			continue
		}
		for i, v := range seq.Content {
			if scalarOf(get(v, "name")) == n.lab.P.vlan49() {
				seq.Content = append(seq.Content[:i], seq.Content[i+1:]...)
				return
			}
		}
	}
}

func killSwitchesOff(root *yaml.Node) {
	if fw := get(root, "firewall"); fw != nil {
		del(fw, "killSwitch")
	}
	if r := get(root, "routing"); r != nil {
		if ts := get(r, "tables"); ts != nil {
			for _, t := range ts.Content {
				set(t, "killSwitch", scalar("false"))
			}
		}
	}
}

func labelsGone(root *yaml.Node) {
	if k := get(root, "kubernetes"); k != nil {
		del(k, "labels")
		del(k, "conditionalLabels")
	}
}

func rulesGone(root *yaml.Node) {
	if r := get(root, "routing"); r != nil {
		del(r, "rules")
	}
}

// nsRunStdin is nsRun with stdin.
func nsRunStdin(ns interface {
	Do(func() error) error
}, stdin string, args ...string) (string, error) {
	var out []byte
	err := ns.Do(func() error {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdin = strings.NewReader(stdin)
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	return string(out), err
}
