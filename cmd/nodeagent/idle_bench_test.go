package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// BenchmarkIdleDaemon5000Peers runs the real daemon with a WireGuard
// device of 5000 register peers (the kernel's in the VM, the userspace one
// in a host namespace) and, once it is ready and has settled, measures its
// CPU over 60 s of nothing changing from /proc/PID/stat (utime + stime)
// and its resident memory from /proc/PID/status, after the first resync
// (which reads the register whole, see below). Targets: at most 1 % of
// one core, RSS at most 60 MiB. Run with -benchtime=1x; IDLE_SECONDS
// shortens the window.
//
// With the userspace device the same run also measures wireguard-go by
// itself, holding the same peers in a namespace of its own
// (testenv/cmd/wgfloor), over the same window: the memory the embedded
// device needs whatever the daemon around it does.
func BenchmarkIdleDaemon5000Peers(b *testing.B) {
	testenv.RequireRoot(b)
	impl := "userspace"
	if testenv.HasModule("wireguard") {
		impl = "kernel"
	}
	window := 60 * time.Second
	if s, err := strconv.Atoi(os.Getenv("IDLE_SECONDS")); err == nil && s > 0 {
		window = time.Duration(s) * time.Second
	}
	const peers = 5000
	for i := 0; i < b.N; i++ {
		node := testenv.NewNetNS(b)
		bin := binary(b)
		dir := b.TempDir()
		b.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
		key := filepath.Join(dir, "wg.key")
		k, _ := wgtypes.GeneratePrivateKey()
		os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
		reg := filepath.Join(dir, "peers.d")
		written := testenv.WriteRegister(b, reg, peers)
		dev := "wgidle" + node.Name[len(node.Name)-4:]
		cfg := filepath.Join(dir, "nodeagent.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("wireguard:\n  - name: %s\n    implementation: %s\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.90.0.1/16]\n    peersDir: %s\n", dev, impl, key, reg)), 0o600)
		socket := filepath.Join(dir, "s.sock")
		cmd := exec.Command("ip", "netns", "exec", node.Name, bin, "run", "-c", cfg, "--socket", socket, "--state-dir", filepath.Join(dir, "state"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stop := func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
		c := api.NewClient(socket)
		var s *api.Status
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, _ = c.Status(ctx)
			cancel()
			if s != nil && s.Ready {
				break
			}
			if time.Now().After(deadline) {
				stop()
				b.Fatalf("not ready in 3 minutes; log:\n%.4096s", stderr.String())
			}
		}
		live := 0
		for _, d := range s.WireGuard {
			live += len(d.Peers)
		}
		if live != peers {
			stop()
			b.Fatalf("the device has %d peers; want %d", live, peers)
		}
		// Settle: the first polls after start read the device whole, and
		// the first resync reads every register file again (the file
		// watch began after the start's read, so what it would have seen
		// before is unknown). The window begins after both.
		for deadline := time.Now().Add(2 * time.Minute); s.LastSync == nil || s.LastSync.Trigger != "resync"; time.Sleep(time.Second) {
			if time.Now().After(deadline) {
				stop()
				b.Fatalf("no resync in 2 minutes; log:\n%.4096s", stderr.String())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if st, err := c.Status(ctx); err == nil {
				s = st
			}
			cancel()
		}
		var floor *exec.Cmd
		if impl == "userspace" {
			floor = startFloor(b, k, written)
			defer func() { floor.Process.Signal(syscall.SIGTERM); floor.Wait() }()
		}
		time.Sleep(5 * time.Second)
		pid := cmd.Process.Pid
		cpu0, run0, at0 := cpuTicks(b, pid), runNanos(b, pid), time.Now()
		var fcpu0 int64
		if floor != nil {
			fcpu0 = cpuTicks(b, floor.Process.Pid)
		}
		time.Sleep(window)
		cpu1, run1, at1 := cpuTicks(b, pid), runNanos(b, pid), time.Now()
		rssKiB, hwmKiB, anonKiB := memKiB(b, pid, "VmRSS"), memKiB(b, pid, "VmHWM"), memKiB(b, pid, "RssAnon")
		if floor != nil {
			fpid := floor.Process.Pid
			fshare := float64(cpuTicks(b, fpid)-fcpu0) / clockTicks / at1.Sub(at0).Seconds() * 100
			frss, fanon := memKiB(b, fpid, "VmRSS"), memKiB(b, fpid, "RssAnon")
			b.ReportMetric(float64(frss)/1024, "wggo-rss-MiB")
			b.ReportMetric(float64(rssKiB)/float64(frss), "rss/wggo")
			fmt.Printf("\nwireguard-go alone (testenv/cmd/wgfloor), the same %d peers, up and idle over the same window: RSS %.1f MiB (%.1f MiB anonymous), CPU %.2f %% of one core; the daemon's RSS is %.2fx that\n",
				peers, float64(frss)/1024, float64(fanon)/1024, fshare, float64(rssKiB)/float64(frss))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		after, err := c.Status(ctx)
		cancel()
		stop()
		if err != nil || !after.Ready {
			b.Fatalf("status after the window: %v", err)
		}
		share := float64(cpu1-cpu0) / clockTicks / at1.Sub(at0).Seconds() * 100
		precise := float64(run1-run0) / float64(at1.Sub(at0).Nanoseconds()) * 100
		b.ReportMetric(share, "cpu-%-of-core")
		b.ReportMetric(precise, "run-%-of-core")
		b.ReportMetric(float64(rssKiB)/1024, "rss-MiB")
		b.ReportMetric(float64(hwmKiB)/1024, "peak-rss-MiB")
		b.ReportMetric(float64(anonKiB)/1024, "rss-anon-MiB")
		fmt.Printf("\nidle daemon, %d %s WireGuard peers, %s with nothing changing: CPU %.2f %% of one core (target <= 1 %%; %.2f %% by the scheduler's run time), RSS %.1f MiB (target <= 60 MiB; %.1f MiB of it anonymous, the rest the binary's pages), peak %.1f MiB; the last sync (%s) took %.0f ms\n\n",
			peers, impl, at1.Sub(at0).Round(time.Second), share, precise, float64(rssKiB)/1024, float64(anonKiB)/1024, float64(hwmKiB)/1024, after.LastSync.Trigger, after.LastSync.DurationMS)
	}
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux.
const clockTicks = 100

// cpuTicks is the process's utime + stime from /proc/PID/stat.
func cpuTicks(tb testing.TB, pid int) int64 {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		tb.Fatalf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// runNanos is the time the process's threads have run on a CPU, summed
// from /proc/PID/task/*/schedstat (its first field, in ns). utime and
// stime are sampled at the scheduler's tick, which charges a whole tick
// to a thread woken by a timer on that tick; the run time is measured.
// Threads that exit are not counted; the Go runtime keeps its threads.
func runNanos(tb testing.TB, pid int) int64 {
	tb.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		tb.Fatal(err)
	}
	var sum int64
	for _, t := range tasks {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // exited meanwhile
		}
		f := strings.Fields(string(raw))
		if len(f) == 0 {
			tb.Fatalf("/proc/%d/task/%s/schedstat: empty", pid, t.Name())
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		sum += n
	}
	return sum
}

// memKiB reads one Vm* line of /proc/PID/status.
func memKiB(tb testing.TB, pid int, field string) int {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(field + `:\s+(\d+) kB`).FindSubmatch(raw)
	if m == nil {
		tb.Fatalf("no %s in /proc/%d/status", field, pid)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// startFloor runs testenv/cmd/wgfloor in a namespace of its own: a
// wireguard-go device with key and the register's peers (their keys and
// allowed IPs, as the daemon's device has them), and nothing else. It
// returns once the device is up.
func startFloor(b *testing.B, key wgtypes.Key, peers []testenv.RegisterPeer) *exec.Cmd {
	b.Helper()
	dir := b.TempDir()
	bin := filepath.Join(dir, "wgfloor")
	if out, err := exec.Command("go", "build", "-o", bin, "../../testenv/cmd/wgfloor").CombinedOutput(); err != nil {
		b.Fatalf("build wgfloor: %v\n%s", err, out)
	}
	var uapi strings.Builder
	fmt.Fprintf(&uapi, "private_key=%x\nlisten_port=51820\nreplace_peers=true\n", key[:])
	for _, p := range peers {
		fmt.Fprintf(&uapi, "public_key=%x\nallowed_ip=%s\n", p.Key[:], p.AllowedIP)
	}
	conf := filepath.Join(dir, "peers.uapi")
	if err := os.WriteFile(conf, []byte(uapi.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	ns := testenv.NewNetNS(b)
	cmd := exec.Command("ip", "netns", "exec", ns.Name, bin, "-name", "wgfloor0", "-conf", conf)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		b.Fatalf("wgfloor did not come up: %v %q; %.2048s", err, line, stderr.String())
	}
	return cmd
}
