// Package soak is `make soak`: the homelab of examples/homelab.yaml, run
// by the real nodeagent binary in network namespaces (the trunk, VLAN 50
// with a pod on the node attached by the macvlan CNI plugin and a host
// beyond the trunk, the shim, the PIA tunnel against testenv/piastub with
// port forwarding and a hook, wg0 with two remote clients, labels against
// a real kube-apiserver), under traffic from the pod, the VLAN host and
// the clients, while a nemesis makes, at random from a seed it prints,
// the faults the tests make one at a time, several at once. A monitor
// checks the invariants the whole time, not at the end:
//
//   - no packet of VLAN 50 or of wg0's clients reaches the WAN outside the
//     tunnel (counted at the WAN router);
//   - the kill switch is armed: both its layers (table 150's rules and
//     unreachable default; the nftables forward drops with their sets),
//     always; a layer the nemesis deleted itself is excused for the
//     repair bound;
//   - no foreign object is touched: the pod's links, addresses and routes,
//     another manager's rule and routes (in main, in table 150, in a table
//     of its own), a firewall's nft table;
//   - the daemon's RSS, open fds and goroutines stay within bounds, and
//     none of them grows over a daemon's quiet life; no hook outlives its
//     timeout; the daemon exits only when killed (or when started on a
//     config that does not validate);
//   - after each fault, once no other is under way, the daemon converges
//     (an empty plan, Ready) within a bound;
//   - after the nemesis: converged, ready, not degraded, the forwarded port
//     delivered to the pod's app and reachable from the internet, every
//     remote client handshaking, the Node's labels in place.
//
// The schedule is a pure function of the seed (Schedule): a violation is
// printed with the seed, and the same seed replays the same faults.
package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Options configure a run.
type Options struct {
	// Duration is the nemesis's; the run is longer by the set-up and the
	// settling at the end.
	Duration time.Duration
	// Seed picks the faults (0: a random one, printed).
	Seed uint64
	// Nodeagent is the daemon's binary.
	Nodeagent string
	// Example is examples/homelab.yaml's content.
	Example []byte
	// LogDir keeps the daemon's log, the schedule and the report.
	LogDir string
	Out    io.Writer
	// Kube is an API server already running (shared by runs), or nil.
	Kube *kubetest.Server
	// StopOnViolation ends the nemesis at the first violation.
	StopOnViolation bool
	// Settle bounds the wait for the end state after the nemesis. The
	// tunnel may be backing off for up to 5 minutes (the provider's
	// BackoffMax) when the last PIA fault ends.
	Settle   time.Duration
	Bounds   Bounds
	Schedule ScheduleOptions
	// Replay is the command that replays a run, with %d for the seed.
	Replay string
}

// Result is what a run found.
type Result struct {
	Seed       uint64
	Schedule   []Fault
	Violations []Violation
	Figures    Figures
}

// Run runs the soak. Set-up failures fail t; invariants broken are in
// the Result (and printed as they are found).
func Run(t testing.TB, o Options) *Result {
	if o.Seed == 0 {
		o.Seed = rand.Uint64()%1_000_000_000 + 1
	}
	if o.Settle == 0 {
		o.Settle = 7 * time.Minute
	}
	if o.Bounds == (Bounds{}) {
		o.Bounds = DefaultBounds
	}
	if o.Schedule.MeanGap == 0 {
		o.Schedule = DefaultSchedule
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	os.MkdirAll(o.LogDir, 0o755)
	var outMu sync.Mutex
	start := time.Now()
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(o.Out, "[%7s] "+format+"\n", append([]any{time.Since(start).Round(time.Second)}, a...)...)
	}
	schedule := Schedule(o.Seed, o.Duration, o.Schedule)
	res := &Result{Seed: o.Seed, Schedule: schedule}
	if o.Replay == "" {
		o.Replay = fmt.Sprintf("make soak SOAK=%s SEED=%%d", o.Duration)
	}
	replay := fmt.Sprintf(o.Replay, o.Seed)
	say("soak: seed %d, %d faults over %s, schedule %s (written to %s); replay: %s", o.Seed, len(schedule), o.Duration,
		ScheduleHash(schedule), filepath.Join(o.LogDir, "schedule.txt"), replay)
	os.WriteFile(filepath.Join(o.LogDir, "schedule.txt"), []byte(fmt.Sprintf("# seed %d, %s, hash %s\n%s", o.Seed, o.Duration, ScheduleHash(schedule), ScheduleText(schedule))), 0o644)

	say("building the lab (namespaces, the PIA stub, kube-apiserver, the config from %s)", ExampleFile)
	lab := NewLab(t, o.LogDir, o.Kube, o.Example)
	os.WriteFile(filepath.Join(o.LogDir, "nodeagent.yaml"), lab.Good, 0o644)
	client := api.NewClient(lab.Socket)
	sup := &supervisor{bin: o.Nodeagent, cfg: lab.Config, socket: lab.Socket, stateDir: lab.StateDir,
		rtTables: filepath.Join(lab.Dir, "rt_tables.conf"), logFile: filepath.Join(o.LogDir, "nodeagent.log"),
		netns: lab.Node.Name, piaDev: lab.P.PIADev, clockFile: lab.clockFile, client: client, killed: map[int]bool{}, done: make(chan struct{})}
	mon := newMonitor(lab, sup, client, o.Bounds, func(f string, a ...any) { say(f, a...) })
	nem := &nemesis{lab: lab, sup: sup, client: client, mon: mon, logf: func(f string, a ...any) { say(f, a...) }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mon.violated = func(v Violation) {
		say("VIOLATION %s\n    seed %d; replay: %s", v, o.Seed, replay)
		if o.StopOnViolation {
			cancel()
		}
	}
	sup.exited = func(pid int, err error, logTail string) {
		if nem.configBad.Load() {
			say("daemon %d exited (%v) on a config that does not validate, as it should; started again in 1s", pid, err)
			return
		}
		mon.violation(invExit, fmt.Sprintf("daemon %d exited by itself: %v; its log ends:\n%s", pid, err, indent(logTail)))
	}
	supCtx, supCancel := context.WithCancel(context.Background())
	go sup.run(supCtx)
	t.Cleanup(func() { supCancel(); sup.Stop() })

	// Up: the daemon converged, the tunnel healthy, the port delivered.
	t0 := time.Now()
	if err := waitFor(ctx, 3*time.Minute, say, func() (bool, string) {
		s, err := status(ctx, client)
		if err != nil {
			return false, err.Error()
		}
		return s.Ready && len(s.PIA) == 1 && s.PIA[0].Healthy && s.PIA[0].ForwardedPort > 0, fmt.Sprintf("ready %v, pia %+v", s.Ready, s.PIA)
	}); err != nil {
		t.Fatalf("the daemon did not come up: %v\n%s", err, tail(sup.logFile, 40))
	}
	say("the daemon is ready, the tunnel healthy, in %s", time.Since(t0).Round(100*time.Millisecond))
	lab.Start()
	t0 = time.Now()
	if err := waitFor(ctx, 2*time.Minute, say, func() (bool, string) { return lab.allWell(ctx, client, false) }); err != nil {
		t.Fatalf("the lab is not all well before the nemesis: %v\n%s", err, tail(sup.logFile, 40))
	}
	say("pod, VLAN host and clients are through; the port is delivered (%s)", time.Since(t0).Round(100*time.Millisecond))

	// The monitor's own check: before any fault, every invariant holds
	// and every observer sees what it looks for (a checker that cannot
	// see would pass vacuously).
	if present, why := mon.layers(); !present[layerNFT] || !present[layerRules] || !present[layerRoutes] {
		t.Fatalf("before the nemesis, the kill switch is not seen armed: %v %v", present, why)
	}
	if c, err := mon.leakCounters(); err != nil || len(c) != len(leakWhat) {
		t.Fatalf("the WAN's counters: %v %v", c, err)
	}
	if out, err := nsRun(lab.Node, "nft", "list", "table", "inet", "nodeagent"); err == nil {
		os.WriteFile(filepath.Join(o.LogDir, "nft-before.txt"), []byte(out), 0o644)
	}
	mon.checkForeign()
	mon.checkLeaks()

	// The nemesis, with the monitor checking throughout.
	monCtx, monCancel := context.WithCancel(context.Background())
	monDone := make(chan struct{})
	mon.mu.Lock()
	mon.start = time.Now()
	mon.mu.Unlock()
	go func() { defer close(monDone); mon.run(monCtx) }()
	say("the nemesis starts: %d faults over %s", len(schedule), o.Duration)
	nemStart := time.Now()
	owners := map[string]*sync.Mutex{}
	for _, k := range Kinds {
		for _, r := range k.owns {
			if owners[r] == nil {
				owners[r] = &sync.Mutex{}
			}
		}
	}
	var wg sync.WaitGroup
	for _, f := range schedule {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(nemStart.Add(f.At))):
		}
		if ctx.Err() != nil {
			break
		}
		k := kindOf(f.Kind)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Resources are taken in the kinds' order: no deadlock.
			held := slices.Clone(k.owns)
			sort.Strings(held)
			waited := time.Now()
			for _, r := range held {
				owners[r].Lock()
			}
			if w := time.Since(waited); w > time.Second {
				say("%s: waited %s for %v", f, fmtDur(w), held)
			}
			defer func() {
				if k.tail > 0 {
					time.Sleep(k.tail)
				}
				for _, r := range held {
					owners[r].Unlock()
				}
			}()
			say("fault %s", f)
			mon.begin(f)
			err := nem.run(ctx, f)
			mon.end(f, err)
			if err != nil {
				say("fault %s: %v", f, err)
			}
		}()
	}
	wg.Wait()
	say("the nemesis stops after %s", time.Since(nemStart).Round(time.Second))

	// The end state, within the bound; a run stopped at its first
	// violation has its verdict and does not wait for it (a daemon broken
	// on purpose never gets there: TestSoakCanFail spent the whole bound).
	t0 = time.Now()
	endCtx := context.Background()
	why := ""
	settle := o.Settle
	mon.mu.Lock()
	if o.StopOnViolation && len(mon.vs) > 0 {
		settle = 0
	}
	mon.mu.Unlock()
	err := waitFor(endCtx, settle, say, func() (bool, string) {
		ok, w := lab.allWell(endCtx, client, true)
		if ok {
			ok, w = mon.converged(endCtx)
		}
		if present, missing := mon.layers(); ok && len(missing) > 0 {
			ok, w = false, fmt.Sprintf("kill switch: %v %v", present, missing)
		}
		why = w
		return ok, w
	})
	if err != nil && settle == 0 {
		say("the end state is not waited for: stopped at the first violation (%s)", why)
	} else if err != nil {
		mon.violation(invEnd, fmt.Sprintf("not all well %s after the nemesis stopped: %s", o.Settle, why))
	} else {
		mon.fig.Settle = time.Since(t0)
		say("all well %s after the nemesis stopped", time.Since(t0).Round(100*time.Millisecond))
	}
	// A last look at the kernel: no duplicates, nothing left half made.
	for _, p := range lab.leftovers() {
		mon.violation(invEnd, p)
	}
	monCancel()
	<-monDone
	mon.mu.Lock()
	res.Violations = slices.Clone(mon.vs)
	fig := mon.fig
	mon.mu.Unlock()
	fig.Leaks = append(fig.Leaks, mon.leaks()...)
	for _, lk := range mon.leaks() {
		res.Violations = append(res.Violations, Violation{Invariant: invLeakGrow, Detail: lk})
	}
	if fig.loadN > 0 {
		fig.LoadMean = fig.loadSum / float64(fig.loadN)
	}
	res.Figures = fig
	report := Report(res, o.Duration)
	os.WriteFile(filepath.Join(o.LogDir, "report.txt"), []byte(report), 0o644)
	outMu.Lock()
	fmt.Fprint(o.Out, report)
	outMu.Unlock()
	return res
}

// Report is a run's figures and violations as printed.
func Report(r *Result, d time.Duration) string {
	var b strings.Builder
	f := r.Figures
	fmt.Fprintf(&b, "\n== soak report: seed %d, %s of faults, schedule %s\n", r.Seed, d, ScheduleHash(r.Schedule))
	var kinds []string
	total := 0
	for k, n := range f.Faults {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(&b, "faults made: %d (%s)\n", total, strings.Join(kinds, ", "))
	if len(f.Skipped) > 0 {
		var sk []string
		for k, n := range f.Skipped {
			sk = append(sk, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(sk)
		fmt.Fprintf(&b, "faults skipped (nothing to act on then): %s\n", strings.Join(sk, ", "))
	}
	fmt.Fprintf(&b, "leaks: %d%s\n", len(f.Leaks), bullet(f.Leaks))
	fmt.Fprintf(&b, "daemon: max RSS %.1f MiB, max open fds %d, max goroutines %d (%d samples)\n", float64(f.MaxRSS)/(1<<20), f.MaxFDs, f.MaxGoroutines, f.Samples)
	fmt.Fprintf(&b, "worst time to converge after a fault: %s (after %s; %d measured, %d cut short by the next fault)\n", fmtDur(f.WorstConverge), f.WorstConvergeAfter, f.Converges, f.Interrupted)
	fmt.Fprintf(&b, "worst time to repair a deleted kill-switch layer: %s (%s; %d repairs, seen every 500ms)\n", fmtDur(f.WorstRepair), f.WorstRepairLayer, f.Repairs)
	fmt.Fprintf(&b, "worst time to ready after kill -9: %s (%d kills, %d restarts timed)\n", fmtDur(f.WorstReady), f.Kills, f.Readies)
	fmt.Fprintf(&b, "all well after the nemesis in %s\n", fmtDur(f.Settle))
	fmt.Fprintf(&b, "machine load (1 min): min %.1f, mean %.1f, max %.1f\n", f.LoadMin, f.LoadMean, f.LoadMax)
	fmt.Fprintf(&b, "violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(v.String(), "\n", "\n  "))
	}
	if len(r.Violations) > 0 {
		fmt.Fprintf(&b, "seed %d replays this run's faults\n", r.Seed)
	}
	return b.String()
}

func bullet(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	return "\n  - " + strings.Join(ss, "\n  - ")
}

func indent(s string) string { return "      " + strings.ReplaceAll(s, "\n", "\n      ") }

// waitFor polls cond until it holds, within d; say, when set, hears why
// not every 15 s.
func waitFor(ctx context.Context, d time.Duration, say func(string, ...any), cond func() (bool, string)) error {
	start := time.Now()
	next := start.Add(15 * time.Second)
	why := ""
	for {
		ok, w := cond()
		if ok {
			return nil
		}
		why = w
		if time.Since(start) > d {
			return fmt.Errorf("after %s: %s", d, why)
		}
		if say != nil && time.Now().After(next) {
			say("still waiting (%s): %s", fmtDur(time.Since(start)), why)
			next = next.Add(15 * time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func status(ctx context.Context, c *api.Client) (*api.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.Status(ctx)
}

// allWell reports whether the lab is as it should be once faults end:
// ready, not degraded, the tunnel healthy, the port delivered and
// reachable, every client handshaking and through, the Node labelled.
// Before the nemesis (labels false) the conditional label is not waited
// for: it follows the tunnel's health after a hold (agent/kube's
// hysteresis), half a minute of nothing to test.
func (l *Lab) allWell(ctx context.Context, c *api.Client, labels bool) (bool, string) {
	s, err := status(ctx, c)
	if err != nil {
		return false, err.Error()
	}
	var bad []string
	if !s.Ready || s.Degraded {
		for _, cd := range s.Conditions {
			if cd.Status != api.True && cd.Type != api.CondCoexistence {
				bad = append(bad, fmt.Sprintf("%s %s %s: %s", cd.Type, cd.Status, cd.Reason, cd.Message))
			}
		}
		bad = append(bad, fmt.Sprintf("ready %v degraded %v", s.Ready, s.Degraded))
	}
	if len(s.PIA) != 1 || !s.PIA[0].Healthy {
		bad = append(bad, fmt.Sprintf("tunnel %+v", s.PIA))
		return false, strings.Join(bad, "; ")
	}
	port := s.PIA[0].ForwardedPort
	if c := s.Condition(api.CondPortDelivered); c == nil || c.Status != api.True {
		bad = append(bad, fmt.Sprintf("port %d not delivered: %+v", port, c))
	}
	if got := l.podApp.Port(); got != port || !l.forwardedReach(port) {
		bad = append(bad, fmt.Sprintf("forwarded port %d: the app listens on %d, reached from the internet %v", port, got, l.forwardedReach(port)))
	}
	for _, w := range s.WireGuard {
		if w.Name != l.P.WG0Dev {
			continue
		}
		for _, p := range w.Peers {
			if p.Name != "phone" && p.Name != "laptop" && p.PublicKey != l.laptopKey.PublicKey().String() && p.PublicKey != l.phoneKey.PublicKey().String() {
				bad = append(bad, "wg0 has a peer the register does not: "+p.Name+" "+p.PublicKey)
				continue
			}
			if !p.Live || p.HandshakeAgeSeconds < 0 || p.HandshakeAgeSeconds > 150 {
				bad = append(bad, fmt.Sprintf("client %s not handshaking (age %ds, live %v)", p.Name, p.HandshakeAgeSeconds, p.Live))
			}
		}
		if len(w.Peers) != 2 {
			bad = append(bad, fmt.Sprintf("wg0 has %d peers, want the 2 clients", len(w.Peers)))
		}
	}
	for _, probe := range []struct {
		what string
		ok   func() bool
	}{
		{"the pod reaches the internet", func() bool { return piastub.ReachTCP(l.Pod.NS, piastub.Far.String()+":8000", 2*time.Second) }},
		{"the VLAN host reaches the internet", func() bool {
			_, err := nsRun(l.LAN, "ping", "-c1", "-W1", "-I", vlanHost, piastub.Far.String())
			return err == nil
		}},
		{"the phone reaches the NAS", func() bool { return piastub.ReachTCP(l.Phone, nas+":8000", 2*time.Second) }},
		{"the laptop reaches the NAS", func() bool { return piastub.ReachTCP(l.Laptop, nas+":8000", 2*time.Second) }},
		{"the laptop reaches the internet through PIA", func() bool {
			return piastub.ReachTCP(l.Laptop, piastub.Far.String()+":8000", 2*time.Second)
		}},
		{"the pod's DNS is answered through the tunnel", func() bool {
			a, err := piastub.DNSQuery(l.Pod.NS, queryDNS, piastub.TestName)
			return err == nil && a == piastub.TestAddr
		}},
	} {
		if !probe.ok() {
			bad = append(bad, "not: "+probe.what)
		}
	}
	if !labels {
		return len(bad) == 0, strings.Join(bad, "; ")
	}
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := l.Kube.Admin.CoreV1().Nodes().Get(kctx, nodeName, metav1.GetOptions{})
	if err != nil {
		bad = append(bad, "node: "+err.Error())
	} else if !labelled(n) {
		bad = append(bad, fmt.Sprintf("node labels %v", n.Labels))
	}
	return len(bad) == 0, strings.Join(bad, "; ")
}

func labelled(n *corev1.Node) bool {
	return n.Labels["homelab.example/vpn-ingress"] == "true" && n.Labels["homelab.example/egress-gateway"] == "true" && n.Labels["homelab.example/soak"] == ""
}

// leftovers are duplicates or half-made objects in the node after the
// nemesis: a rule twice, an extra nft table, a link nodeagent does not
// declare.
func (l *Lab) leftovers() []string {
	var out []string
	rules, _ := l.Node.NL.RuleList(0)
	seen := map[string]int{}
	for _, r := range rules {
		seen[fmt.Sprintf("%d %v %s %d", r.Family, r.Priority, r.Src, r.Table)]++
	}
	for k, n := range seen {
		if n > 1 {
			out = append(out, fmt.Sprintf("rule %s %d times", k, n))
		}
	}
	tables, _ := nsRun(l.Node, "nft", "list", "tables")
	if got := strings.Fields(strings.ReplaceAll(tables, "\n", " ")); !slices.Equal(sorted(got), sorted(strings.Fields("table inet foreign table inet nodeagent"))) {
		out = append(out, "nft tables: "+strings.TrimSpace(tables))
	}
	links, _ := l.Node.NL.LinkList()
	want := []string{"lo", "enp1s0", "uplink", l.floodA, l.floodB, l.P.VLAN(), l.P.vlan49(), "vlan50-shim", l.P.PIADev, l.P.WG0Dev}
	for _, k := range links {
		if !slices.Contains(want, k.Attrs().Name) {
			out = append(out, "link "+k.Attrs().Name+" in the node")
		}
	}
	return out
}

func sorted(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }
