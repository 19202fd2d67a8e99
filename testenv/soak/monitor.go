package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Bounds are the limits the monitor holds the daemon to. They are
// figures measured here (see README's soak section), with room for a
// machine loaded by other work, not guesses.
type Bounds struct {
	// Repair: a kill-switch layer the nemesis deleted is back within it
	// (counted from when a daemon runs).
	Repair time.Duration
	// Converge: once no fault is under way, the plan is empty and the
	// daemon ready within it.
	Converge time.Duration
	// RSS, FDs and Goroutines bound the daemon at every sample.
	RSS        int64
	FDs        int
	Goroutines int
	// HookGrace: a hook process older than the hook's timeout by more
	// than this outlived it.
	HookGrace time.Duration
}

// DefaultBounds are the soak's.
var DefaultBounds = Bounds{
	Repair:     10 * time.Second,
	Converge:   45 * time.Second,
	RSS:        128 << 20,
	FDs:        128,
	Goroutines: 400,
	HookGrace:  15 * time.Second,
}

// A Violation is an invariant broken: when (from the nemesis's start),
// which, how, and the faults under way or just ended then.
type Violation struct {
	At        time.Duration
	Invariant string
	Detail    string
	Faults    []string
}

func (v Violation) String() string {
	s := fmt.Sprintf("+%s %s: %s", fmtDur(v.At), v.Invariant, v.Detail)
	if len(v.Faults) > 0 {
		s += "\n    faults under way or just ended: " + strings.Join(v.Faults, "; ")
	} else {
		s += "\n    no fault under way or just ended"
	}
	return s
}

// Invariants, by name.
const (
	invLeak      = "0 VLAN or client packets at the WAN outside the tunnel"
	invArmed     = "the kill switch armed"
	invForeign   = "no foreign object touched"
	invResources = "the daemon's RSS, fds and goroutines bounded"
	invHook      = "no hook outlives its timeout"
	invExit      = "the daemon exits only when killed"
	invConverge  = "converged and ready after each fault"
	invEnd       = "after the nemesis: converged, ready, not degraded, port delivered, clients handshaking"
	invLeakGrow  = "no growth of fds or goroutines in a daemon's life"
)

// Figures are what a run measured.
type Figures struct {
	Faults  map[string]int
	Skipped map[string]int
	Kills   int
	// MaxRSS, MaxFDs, MaxGoroutines are the daemon's highest samples.
	MaxRSS        int64
	MaxFDs        int
	MaxGoroutines int
	Samples       int
	// WorstConverge is the longest time from the end of a fault (no other
	// under way) to an empty plan and Ready; Converges counts those
	// measured, Interrupted those a new fault cut short.
	WorstConverge      time.Duration
	WorstConvergeAfter string
	Converges          int
	Interrupted        int
	// WorstRepair is the longest time a kill-switch layer the nemesis
	// deleted took to come back (from the deletion, or from the start of
	// a daemon when none ran); Repairs counts them.
	WorstRepair      time.Duration
	WorstRepairLayer string
	Repairs          int
	// WorstReady is the longest time from a daemon's start after kill -9
	// to Ready.
	WorstReady time.Duration
	Readies    int
	// Leaks are what leaked (processes, growth of fds or goroutines).
	Leaks []string
	// Load is the machine's 1-minute load average, lowest, mean, highest.
	LoadMin, LoadMean, LoadMax float64
	loadSum                    float64
	loadN                      int
	// Settle is how long the node took to be all well after the nemesis.
	Settle time.Duration
	// Pings are echo requests answered / sent, by flow.
	Pings map[string]string
}

type ended struct {
	f  Fault
	at time.Time
}

// monitor checks the invariants the whole time, and measures.
type monitor struct {
	lab    *Lab
	sup    *supervisor
	client *api.Client
	bounds Bounds
	logf   func(format string, a ...any)
	// violated hears of each violation as it is found.
	violated func(Violation)

	mu      sync.Mutex
	start   time.Time // the nemesis's
	active  map[int]Fault
	recent  []ended
	gen     int // faults begun
	lastEnd *ended
	endCh   chan struct{}
	delAt   map[string]time.Time // kill-switch layer -> when the nemesis deleted it
	// deleting: the nemesis is deleting the layer now (seen present,
	// it is not back yet).
	deleting map[string]bool
	down     map[string]time.Time // layer -> when first seen missing (unexcused episode reported)
	reported map[string]bool
	killedAt []time.Time
	fig      Figures
	vs       []Violation
	// per daemon pid: first and last quiet samples of fds and goroutines
	life map[int]*life
	// baseline is the foreign objects as found at the start.
	baseline  map[string]string
	leakBase  map[string]int
	lastPid   int
	goroutine int
}

type life struct {
	start                   time.Time
	firstFDs, firstG, lastG int
	lastFDs                 int
	firstAt, lastAt         time.Time
	quietSamples            int
}

func newMonitor(lab *Lab, sup *supervisor, client *api.Client, b Bounds, logf func(string, ...any)) *monitor {
	return &monitor{lab: lab, sup: sup, client: client, bounds: b, logf: logf,
		active: map[int]Fault{}, endCh: make(chan struct{}, 1), delAt: map[string]time.Time{}, deleting: map[string]bool{}, down: map[string]time.Time{},
		reported: map[string]bool{}, life: map[int]*life{},
		fig: Figures{Faults: map[string]int{}, Skipped: map[string]int{}, LoadMin: 1e9, Pings: map[string]string{}}}
}

// since is t from the nemesis's start.
func (m *monitor) since(t time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.start.IsZero() {
		return 0
	}
	return t.Sub(m.start)
}

func (m *monitor) violation(inv, detail string) {
	now := time.Now()
	m.mu.Lock()
	var faults []string
	for _, f := range m.active {
		faults = append(faults, f.String())
	}
	for _, e := range m.recent {
		if now.Sub(e.at) < 30*time.Second {
			faults = append(faults, e.f.String()+fmt.Sprintf(" (ended %s before)", fmtDur(now.Sub(e.at))))
		}
	}
	sort.Strings(faults)
	at := time.Duration(0)
	if !m.start.IsZero() {
		at = now.Sub(m.start)
	}
	v := Violation{At: at, Invariant: inv, Detail: detail, Faults: faults}
	m.vs = append(m.vs, v)
	m.mu.Unlock()
	if m.violated != nil {
		m.violated(v)
	}
}

// begin and end bracket a fault.
func (m *monitor) begin(f Fault) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active[f.N] = f
	m.gen++
}

func (m *monitor) end(f Fault, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.active, f.N)
	e := ended{f, time.Now()}
	m.recent = append(m.recent, e)
	if len(m.recent) > 64 {
		m.recent = m.recent[len(m.recent)-64:]
	}
	m.lastEnd = &e
	if _, ok := err.(errSkipped); ok {
		m.fig.Skipped[f.Kind]++
	} else {
		m.fig.Faults[f.Kind]++
	}
	select {
	case m.endCh <- struct{}{}:
	default:
	}
}

// killed notes a kill -9 (ok: a daemon was running).
func (m *monitor) killed(ok bool) {
	if !ok {
		return
	}
	m.mu.Lock()
	m.fig.Kills++
	m.killedAt = append(m.killedAt, time.Now())
	m.mu.Unlock()
}

// deletingLayer brackets the nemesis's deletion of a kill-switch layer:
// its absence is excused for the repair bound from the deletion's end.
func (m *monitor) deletingLayer(layer string, del func() error) error {
	m.mu.Lock()
	m.deleting[layer] = true
	m.mu.Unlock()
	err := del()
	m.mu.Lock()
	delete(m.deleting, layer)
	m.delAt[layer] = time.Now()
	m.mu.Unlock()
	return err
}

// layersBackBut reports whether every kill-switch layer but the one named
// is in place now.
func (m *monitor) layersBackBut(layer string) bool {
	present, _ := m.layers()
	for l, ok := range present {
		if l != layer && !ok {
			return false
		}
	}
	return true
}

func (m *monitor) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, loop := range []struct {
		every time.Duration
		fn    func()
	}{
		{time.Second, m.checkLeaks},
		{500 * time.Millisecond, m.checkArmed},
		{2 * time.Second, m.checkForeign},
		{time.Second, m.sample},
		{2 * time.Second, m.checkHooks},
		{5 * time.Second, m.sampleLoad},
		{200 * time.Millisecond, m.watchStarts},
		{time.Minute, m.progress},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(loop.every)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					loop.fn()
				}
			}
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); m.watchConverge(ctx) }()
	wg.Wait()
}

var counterRE = regexp.MustCompile(`packets (\d+) bytes \d+ comment "([\w-]+)"`)

// leakCounters are the WAN router's counters of what should never reach it.
func (m *monitor) leakCounters() (map[string]int, error) {
	out, err := nsRun(m.lab.WAN, "nft", "list", "chain", "inet", "leak", "pre")
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	c := map[string]int{}
	for _, mm := range counterRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(mm[1])
		c[mm[2]] = n
	}
	return c, nil
}

func (m *monitor) checkLeaks() {
	c, err := m.leakCounters()
	if err != nil {
		m.logf("leak counters: %v", err)
		return
	}
	m.mu.Lock()
	base := m.leakBase
	if base == nil {
		m.leakBase = c
		base = map[string]int{}
	}
	m.mu.Unlock()
	for k, n := range c {
		if n > base[k] {
			m.violation(invLeak, fmt.Sprintf("%d packets (%s) reached the WAN router outside the tunnel", n-base[k], leakWhat[k]))
		}
	}
	m.mu.Lock()
	m.leakBase = c
	m.mu.Unlock()
}

var leakWhat = map[string]string{
	"vlan": "from VLAN 50, 10.10.50.0/24", "clients": "from wg0's clients, 10.90.0.0/24",
	"plain": "to the internet, 203.0.113.0/24, not in WireGuard", "dns": "DNS outside the tunnel", "dns-tcp": "DNS over TCP outside the tunnel",
}

// layers reports, for each kill-switch layer, whether it is in place, and
// what is missing of those that are not.
func (m *monitor) layers() (map[string]bool, map[string]string) {
	l := m.lab
	node := l.Node
	present := map[string]bool{}
	why := map[string]string{}
	// Rules 1000 and 1002 send VLAN 50 and the clients' pool to table 150.
	rules, err := node.NL.RuleList(netlink.FAMILY_V4)
	if err == nil {
		want := map[int]string{1000: "10.10.50.0/24", 1002: "10.90.0.128/25"}
		for _, r := range rules {
			if src, ok := want[r.Priority]; ok && r.Src != nil && r.Src.String() == src && r.Table == 150 {
				delete(want, r.Priority)
			}
		}
		present[layerRules] = len(want) == 0
		if len(want) > 0 {
			why[layerRules] = fmt.Sprintf("rules missing: %v", want)
		}
	} else {
		why[layerRules] = err.Error()
	}
	// Table 150's unreachable default: nothing falls through it.
	routes, err := node.NL.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 150}, netlink.RT_FILTER_TABLE)
	if err == nil {
		for _, r := range routes {
			if r.Type == unix.RTN_UNREACHABLE && (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Priority == 0xffffffff {
				present[layerRoutes] = true
			}
		}
		if !present[layerRoutes] {
			why[layerRoutes] = "no unreachable default in table 150"
		}
	} else {
		why[layerRoutes] = err.Error()
	}
	// The forward chain's drops for both kill switches, and their sets.
	out, err := nsRun(node, "nft", "list", "table", "inet", "nodeagent")
	if err != nil {
		why[layerNFT] = "no table inet nodeagent"
		present[layerNFT] = false
		return present, why
	}
	missing := nftKillSwitch(out, l.P.PIADev)
	present[layerNFT] = len(missing) == 0
	if len(missing) > 0 {
		why[layerNFT] = strings.Join(missing, "; ")
	}
	return present, why
}

// nftKillSwitch is what the listing of table inet nodeagent lacks of the
// example's two kill switches: VLAN 50 out by dev only, and wg0's pool out
// by dev or to the LAN.
func nftKillSwitch(listing, dev string) []string {
	sets := map[string]string{} // name -> elements text
	var chain, set string
	forward := []string{}
	var elems *strings.Builder
	sc := bufio.NewScanner(strings.NewReader(listing))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case elems != nil:
			elems.WriteString(line)
			if strings.HasSuffix(line, "}") {
				sets[set] = elems.String()
				elems = nil
			}
		case strings.HasPrefix(line, "set "):
			set, chain = strings.Fields(line)[1], ""
		case strings.HasPrefix(line, "chain "):
			chain, set = strings.Fields(line)[1], ""
		case strings.HasPrefix(line, "elements = {") && set != "":
			elems = &strings.Builder{}
			elems.WriteString(line)
			if strings.HasSuffix(line, "}") {
				sets[set] = elems.String()
				elems = nil
			}
		case chain == "forward" && strings.Contains(line, "drop"):
			forward = append(forward, line)
		}
	}
	var missing []string
	for _, ks := range []struct{ base, src, rule string }{
		{"ks_" + dev, "10.10.50.0/24", "ip saddr @ks_" + dev + "_v4 oifname != @ks_" + dev + "_out"},
		{"ks_" + dev + "_to_192.168.2.0-24", "10.90.0.128/25", "ip saddr @ks_" + dev + "_to_192.168.2.0-24_v4 ip daddr != @ks_" + dev + "_to_192.168.2.0-24_v4_to oifname != @ks_" + dev + "_to_192.168.2.0-24_out"},
	} {
		if !slices.ContainsFunc(forward, func(l string) bool {
			return strings.HasPrefix(l, ks.rule) && strings.HasSuffix(strings.TrimSuffix(l, ` comment "nodeagent kill switch"`), "drop")
		}) {
			missing = append(missing, "forward chain: no "+ks.rule+" … drop")
		}
		if !strings.Contains(sets[ks.base+"_v4"], ks.src) {
			missing = append(missing, "set "+ks.base+"_v4 without "+ks.src)
		}
		if !strings.Contains(sets[ks.base+"_out"], `"`+dev+`"`) {
			missing = append(missing, "set "+ks.base+"_out without "+dev)
		}
	}
	return missing
}

func (m *monitor) checkArmed() {
	seen := time.Now()
	present, why := m.layers()
	pid, started := m.sup.Pid()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, layer := range []string{layerRules, layerRoutes, layerNFT} {
		if m.deleting[layer] {
			continue
		}
		if present[layer] {
			at, ok := m.delAt[layer]
			if ok && seen.Before(at) {
				continue // seen before the nemesis's deletion ended
			}
			if ok {
				if started.After(at) {
					at = started
				}
				m.fig.Repairs++
				if d := seen.Sub(at); d > m.fig.WorstRepair {
					m.fig.WorstRepair, m.fig.WorstRepairLayer = d, layer
				}
			}
			delete(m.delAt, layer)
			delete(m.down, layer)
			delete(m.reported, layer)
			continue
		}
		if at, ok := m.delAt[layer]; ok {
			// Deleted by the nemesis: excused while no daemon runs, and
			// for the repair bound from when one does.
			from := at
			if started.After(from) {
				from = started
			}
			if pid == 0 || now.Sub(from) < m.bounds.Repair {
				continue
			}
		}
		if _, ok := m.down[layer]; !ok {
			m.down[layer] = now
		}
		if m.reported[layer] {
			continue
		}
		m.reported[layer] = true
		detail := fmt.Sprintf("%s not in place (%s)", layer, why[layer])
		if at, ok := m.delAt[layer]; ok {
			detail += fmt.Sprintf("; deleted by the nemesis %s ago, not repaired within %s", fmtDur(now.Sub(at)), m.bounds.Repair)
		}
		m.mu.Unlock()
		m.violation(invArmed, detail)
		m.mu.Lock()
	}
}

// foreign is the state of what is not nodeagent's and must stay as found.
func (m *monitor) foreign() (map[string]string, error) {
	l := m.lab
	out := map[string]string{}
	pod := l.Pod.NS.NL
	links, err := pod.LinkList()
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	for _, k := range links {
		a := k.Attrs()
		fmt.Fprintf(&b, "%d %s %s %s mtu %d;", a.Index, a.Name, k.Type(), a.HardwareAddr, a.MTU)
		addrs, _ := pod.AddrList(k, netlink.FAMILY_V4)
		for _, ad := range addrs {
			fmt.Fprintf(&b, " %s", ad.IPNet)
		}
		b.WriteString("\n")
	}
	out["the pod's links and addresses"] = b.String()
	b.Reset()
	routes, err := pod.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		fmt.Fprintf(&b, "%s via %s dev %d\n", r.Dst, r.Gw, r.LinkIndex)
	}
	out["the pod's routes"] = b.String()
	b.Reset()
	node := l.Node.NL
	rules, err := node.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		if r.Priority == 500 {
			fmt.Fprintf(&b, "%d from %s lookup %d\n", r.Priority, r.Src, r.Table)
		}
	}
	out["another manager's rule 500"] = b.String()
	b.Reset()
	for _, table := range []int{254, 150, 200} {
		routes, err := node.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, err
		}
		for _, r := range routes {
			if r.Protocol == 147 || r.Protocol == unix.RTPROT_KERNEL || r.Protocol == unix.RTPROT_BOOT && table == 254 {
				continue
			}
			fmt.Fprintf(&b, "table %d %s via %s dev %d proto %d\n", table, r.Dst, r.Gw, r.LinkIndex, r.Protocol)
		}
	}
	out["other managers' routes"] = b.String()
	nft, err := nsRun(l.Node, "nft", "-s", "list", "table", "inet", "foreign")
	if err != nil {
		nft = "missing: " + err.Error()
	}
	out["the firewall's table inet foreign"] = nft
	return out, nil
}

func (m *monitor) checkForeign() {
	f, err := m.foreign()
	if err != nil {
		m.logf("foreign objects: %v", err)
		return
	}
	m.mu.Lock()
	base := m.baseline
	if base == nil {
		m.baseline = f
	}
	m.mu.Unlock()
	if base == nil {
		return
	}
	for k, v := range f {
		if v != base[k] {
			m.violation(invForeign, fmt.Sprintf("%s changed:\nwas:\n%s\nnow:\n%s", k, base[k], v))
			m.mu.Lock()
			m.baseline[k] = v // reported once per change
			m.mu.Unlock()
		}
	}
}

// goroutines scrapes the daemon's go_goroutines.
func (m *monitor) goroutines() (int, bool) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: m.lab.Node.Host.DialContext, DisableKeepAlives: true}}
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.ParseFloat(v, 64)
			return int(n), err == nil
		}
	}
	return 0, false
}

// quiet reports whether no fault is under way or ended in the last 10s.
func (m *monitor) quietLocked(now time.Time) bool {
	if len(m.active) > 0 {
		return false
	}
	return m.lastEnd == nil || now.Sub(m.lastEnd.at) > 10*time.Second
}

// progress prints the figures so far, once a minute.
func (m *monitor) progress() {
	pid, _ := m.sup.Pid()
	rss, fds, _ := procFigures(pid)
	g, _ := m.goroutines()
	m.mu.Lock()
	made := 0
	for _, n := range m.fig.Faults {
		made += n
	}
	line := fmt.Sprintf("figures: daemon %d RSS %.1f MiB (max %.1f), fds %d (max %d), goroutines %d (max %d); %d faults made, %d violations",
		pid, float64(rss)/(1<<20), float64(m.fig.MaxRSS)/(1<<20), fds, m.fig.MaxFDs, g, m.fig.MaxGoroutines, made, len(m.vs))
	m.mu.Unlock()
	m.logf("%s", line)
}

func (m *monitor) sample() {
	pid, started := m.sup.Pid()
	if pid == 0 {
		return
	}
	rss, fds, ok := procFigures(pid)
	if !ok {
		return
	}
	g, gok := m.goroutines()
	now := time.Now()
	m.mu.Lock()
	m.fig.Samples++
	m.fig.MaxRSS = max(m.fig.MaxRSS, rss)
	m.fig.MaxFDs = max(m.fig.MaxFDs, fds)
	if gok {
		m.fig.MaxGoroutines = max(m.fig.MaxGoroutines, g)
	}
	var over []string
	if rss > m.bounds.RSS {
		over = append(over, fmt.Sprintf("RSS %d MiB > %d MiB", rss>>20, m.bounds.RSS>>20))
	}
	if fds > m.bounds.FDs {
		over = append(over, fmt.Sprintf("%d open fds > %d", fds, m.bounds.FDs))
	}
	if gok && g > m.bounds.Goroutines {
		over = append(over, fmt.Sprintf("%d goroutines > %d", g, m.bounds.Goroutines))
	}
	// Quiet samples of a daemon that has run a while tell leaks from load.
	if gok && m.quietLocked(now) && now.Sub(started) > 60*time.Second {
		lf := m.life[pid]
		if lf == nil {
			lf = &life{start: started, firstFDs: fds, firstG: g, firstAt: now}
			m.life[pid] = lf
		}
		lf.lastFDs, lf.lastG, lf.lastAt = fds, g, now
		lf.quietSamples++
	}
	key := fmt.Sprint(over)
	report := len(over) > 0 && !m.reported["resources "+key]
	if report {
		m.reported["resources "+key] = true
	}
	m.mu.Unlock()
	if report {
		m.violation(invResources, strings.Join(over, ", "))
	}
}

// leaks judges each daemon's life: fds or goroutines that grew between
// its first and last quiet samples, a quarter of an hour or more apart.
func (m *monitor) leaks() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for pid, lf := range m.life {
		if lf.lastAt.Sub(lf.firstAt) < 15*time.Minute {
			continue
		}
		if lf.lastFDs > lf.firstFDs+8 {
			out = append(out, fmt.Sprintf("daemon %d: fds %d -> %d over %s of quiet samples", pid, lf.firstFDs, lf.lastFDs, fmtDur(lf.lastAt.Sub(lf.firstAt))))
		}
		if lf.lastG > lf.firstG+25 {
			out = append(out, fmt.Sprintf("daemon %d: goroutines %d -> %d over %s of quiet samples", pid, lf.firstG, lf.lastG, fmtDur(lf.lastAt.Sub(lf.firstAt))))
		}
	}
	return out
}

// checkHooks finds hook processes older than the hook's timeout allows.
func (m *monitor) checkHooks() {
	timeout, _ := time.ParseDuration(m.lab.P.HookTimeout)
	for _, pid := range hookProcs(m.lab.P.PIADev) {
		age, ok := procAge(pid)
		if !ok || age < timeout+m.bounds.HookGrace {
			continue
		}
		m.mu.Lock()
		key := fmt.Sprintf("hook %d", pid)
		seen := m.reported[key]
		m.reported[key] = true
		if !seen {
			m.fig.Leaks = append(m.fig.Leaks, fmt.Sprintf("hook process %d alive %s (hookTimeout %s)", pid, fmtDur(age), timeout))
		}
		m.mu.Unlock()
		if !seen {
			m.violation(invHook, fmt.Sprintf("hook process %d has run %s; hookTimeout is %s", pid, fmtDur(age), timeout))
		}
	}
}

func (m *monitor) sampleLoad() {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	var l float64
	fmt.Sscanf(string(b), "%f", &l)
	m.mu.Lock()
	m.fig.LoadMin, m.fig.LoadMax = min(m.fig.LoadMin, l), max(m.fig.LoadMax, l)
	m.fig.loadSum += l
	m.fig.loadN++
	m.mu.Unlock()
}

// watchStarts times each daemon started after a kill -9 to Ready.
func (m *monitor) watchStarts() {
	pid, started := m.sup.Pid()
	m.mu.Lock()
	if pid == 0 || pid == m.lastPid {
		m.mu.Unlock()
		return
	}
	m.lastPid = pid
	afterKill := len(m.killedAt) > 0 && m.killedAt[len(m.killedAt)-1].Before(started)
	m.mu.Unlock()
	if !afterKill {
		return
	}
	go func() {
		deadline := started.Add(5 * time.Minute)
		for time.Now().Before(deadline) {
			if p, _ := m.sup.Pid(); p != pid {
				return // gone before it was ready (killed again, or a bad config)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := m.client.Readyz(ctx)
			cancel()
			if err == nil {
				took := time.Since(started)
				m.mu.Lock()
				m.fig.Readies++
				m.fig.WorstReady = max(m.fig.WorstReady, took)
				m.mu.Unlock()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// converged reports whether the daemon plans nothing and is ready with
// the file's config loaded, and if not, why.
func (m *monitor) converged(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := m.client.Plan(ctx)
	if err != nil {
		return false, "plan: " + err.Error()
	}
	if len(p.Lines) > 0 || p.Error != "" {
		return false, "plan: " + strings.Join(p.Lines, "; ") + p.Error
	}
	s, err := m.client.Status(ctx)
	if err != nil {
		return false, "status: " + err.Error()
	}
	if !s.Ready {
		return false, "not ready"
	}
	if c := s.Condition(api.CondConfigLoaded); c == nil || c.Status != api.True {
		return false, fmt.Sprintf("config not loaded: %+v", c)
	}
	return true, ""
}

// watchConverge times, after each fault that ends with no other under
// way, how long the daemon takes to converge; a new fault cuts it short.
func (m *monitor) watchConverge(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.endCh:
		}
		m.mu.Lock()
		if len(m.active) > 0 || m.lastEnd == nil {
			m.mu.Unlock()
			continue
		}
		gen, last := m.gen, *m.lastEnd
		m.mu.Unlock()
		reported := false
		why := ""
		for {
			ok, w := m.converged(ctx)
			why = w
			m.mu.Lock()
			cut := m.gen != gen
			m.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			if cut {
				m.mu.Lock()
				m.fig.Interrupted++
				m.mu.Unlock()
				break
			}
			took := time.Since(last.at)
			if ok {
				m.mu.Lock()
				m.fig.Converges++
				if took > m.fig.WorstConverge {
					m.fig.WorstConverge, m.fig.WorstConvergeAfter = took, last.f.String()
				}
				m.mu.Unlock()
				break
			}
			if took > m.bounds.Converge && !reported {
				reported = true
				m.violation(invConverge, fmt.Sprintf("not converged %s after %s, the last fault: %s", fmtDur(took), last.f, why))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
}
