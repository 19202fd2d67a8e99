package soak

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// A Fault is one of the nemesis's faults: what, when (from the start of
// the nemesis), for how long, and which variant.
type Fault struct {
	N    int
	At   time.Duration
	Kind string
	For  time.Duration
	Arg  int
}

func (f Fault) String() string {
	s := fmt.Sprintf("#%d +%s %s", f.N, fmtDur(f.At), f.Kind)
	if a := kindOf(f.Kind).describe(f.Arg); a != "" {
		s += " (" + a + ")"
	}
	if f.For > 0 {
		s += " for " + fmtDur(f.For)
	}
	return s
}

// fmtDur prints d to a tenth of a second.
func fmtDur(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

// kind is a kind of fault: how often it is picked (weight), how long it
// lasts, its variants, and the resources it holds while it lasts and for
// tail after (the time to repair what it did): it owns some (no other
// fault holding them may overlap it) and uses others (only an owner of
// them may not overlap it).
type kind struct {
	name     string
	weight   int
	min, max time.Duration
	args     []string // the variants, described
	owns     []string
	uses     []string
	tail     time.Duration
}

func (k kind) describe(arg int) string {
	if len(k.args) == 0 {
		return ""
	}
	return k.args[arg%len(k.args)]
}

const (
	// resRestart: a held save is on disk. An operator's reload (SIGHUP,
	// nodeagentctl reload) or a start applies it by design (saveguard:
	// the save is held until an operator asks), so those are not made
	// while one is.
	resRestart = "restart"
	// resKillSwitch: a layer of a kill switch is deleted and not yet
	// repaired. The nemesis never deletes both layers (the routing: table
	// 150 and its rules; nftables: the forward chain's drop) at once:
	// with both gone by hand, no daemon could keep a packet in; what the
	// soak asks is that nodeagent brings each back before the other goes.
	resKillSwitch = "kill switch"
)

// Kinds is every fault the nemesis makes. Each is one the tests already
// make one at a time (see faults.go for where).
var Kinds = []kind{
	{name: "kill9", weight: 3, max: 3 * time.Second, owns: []string{"daemon"}, uses: []string{resRestart}, tail: 20 * time.Second},
	{name: "sighup-storm", weight: 2, min: 500 * time.Millisecond, max: 3 * time.Second, args: []string{"5 signals", "20 signals", "50 signals"}, owns: []string{"sighup"}, uses: []string{resRestart}},
	{name: "reload-storm", weight: 2, min: 500 * time.Millisecond, max: 3 * time.Second, args: []string{"3 reloads", "10 reloads", "20 reloads"}, owns: []string{"reload"}, uses: []string{resRestart}},
	{name: "save-good", weight: 3, min: 2 * time.Second, max: 20 * time.Second, owns: []string{"config"},
		args: []string{"a label, in place", "a route, in place", "VLAN 49 gone, in place", "a label, renamed over", "a route, renamed over", "VLAN 49 gone, renamed over"}},
	{name: "save-held", weight: 2, min: 3 * time.Second, max: 20 * time.Second, owns: []string{"config", resRestart},
		args: []string{"kill switches off", "every label gone", "every rule gone"}},
	{name: "save-rejected", weight: 2, min: 3 * time.Second, max: 20 * time.Second, owns: []string{"config"},
		args: []string{"VLAN id 4095", "an unknown field", "an empty file"}},
	{name: "peer-add", weight: 2, min: 5 * time.Second, max: 30 * time.Second, owns: []string{"peers"}},
	{name: "peer-broken", weight: 2, min: 3 * time.Second, max: 20 * time.Second, owns: []string{"peers"}, args: []string{"a new file that does not parse", "the phone's file garbled"}},
	{name: "peer-remove", weight: 2, min: 2 * time.Second, max: 15 * time.Second, owns: []string{"peers"}, args: []string{"phone", "laptop"}},
	{name: "del-nft-table", weight: 2, owns: []string{resKillSwitch}, tail: 5 * time.Second},
	{name: "del-nft-chain", weight: 1, owns: []string{resKillSwitch}, tail: 5 * time.Second, args: []string{"forward flushed", "postrouting deleted"}},
	{name: "del-rule", weight: 2, owns: []string{resKillSwitch}, tail: 5 * time.Second, args: []string{"priority 1000", "priority 1002"}},
	{name: "del-routes", weight: 2, owns: []string{resKillSwitch}, tail: 5 * time.Second, args: []string{"table 150's, as networkd's ManageForeignRoutes", "table 150's default and unreachable"}},
	{name: "del-addr", weight: 2, owns: []string{"addr"}, tail: 3 * time.Second, args: []string{"the shim's 10.10.50.1/24", "VLAN 49's 10.10.49.10/24"}},
	{name: "del-link", weight: 1, owns: []string{"link"}, tail: 3 * time.Second, args: []string{"the shim", "VLAN 49"}},
	{name: "link-down", weight: 2, owns: []string{"link-down"}, tail: 3 * time.Second, args: []string{"the shim", "VLAN 50"}},
	{name: "del-peer", weight: 2, owns: []string{"wg-peer"}, tail: 3 * time.Second, args: []string{"phone", "laptop"}},
	{name: "del-wgpia", weight: 1, owns: []string{"wgpia-link"}, tail: 5 * time.Second},
	{name: "sysctl", weight: 2, owns: []string{"sysctl"}, tail: 3 * time.Second, args: []string{"ip_forward 0", "the shim's rp_filter 1"}},
	{name: "flood", weight: 2, min: 2 * time.Second, max: 10 * time.Second, owns: []string{"flood"}, args: []string{"the shim's txqueuelen every 10ms", "a foreign link flapping every 10ms"}},
	{name: "pia-restart", weight: 2, owns: []string{"pia-restart"}, tail: 5 * time.Second},
	{name: "pia-udp", weight: 2, min: 5 * time.Second, max: 60 * time.Second, owns: []string{"pia-path"}},
	{name: "pia-down", weight: 1, min: 5 * time.Second, max: 45 * time.Second, owns: []string{"pia-path"}},
	{name: "pia-429", weight: 2, min: 5 * time.Second, max: 60 * time.Second, owns: []string{"pia-token"},
		args: []string{"no Retry-After", "Retry-After 5", "Retry-After 30", "Retry-After 0, tokens expired"}},
	{name: "pia-500", weight: 2, min: 5 * time.Second, max: 60 * time.Second, owns: []string{"pia-token"}, args: []string{"tokens kept", "tokens expired"}},
	{name: "pia-slow", weight: 1, min: 10 * time.Second, max: 60 * time.Second, owns: []string{"pia-slow"}, args: []string{"2s", "5s", "9s"}},
	{name: "pia-bind", weight: 2, min: 10 * time.Second, max: 60 * time.Second, owns: []string{"pia-bind"}, args: []string{"503 to every bind", "401 to the next 2", "409 to the next 2"}},
	{name: "pia-login", weight: 1, owns: []string{"pia-login"}, args: []string{"1 addKey", "3 addKeys"}},
	{name: "kube-stop", weight: 1, min: 5 * time.Second, max: 90 * time.Second, owns: []string{"kube"}, tail: 10 * time.Second},
	{name: "kube-hang", weight: 1, min: 5 * time.Second, max: 60 * time.Second, owns: []string{"kube"}},
	{name: "clock-step", weight: 1, min: 5 * time.Second, max: 60 * time.Second, owns: []string{"clock"}, args: []string{"+1h", "+25h", "-10m", "+3y"}},
	{name: "state-full", weight: 1, min: 10 * time.Second, max: 60 * time.Second, owns: []string{"state"}},
	{name: "state-ro", weight: 1, min: 10 * time.Second, max: 60 * time.Second, owns: []string{"state"}},
	{name: "hook-hang", weight: 1, min: 20 * time.Second, max: 90 * time.Second, owns: []string{"hook"}},
	{name: "hook-fail", weight: 1, min: 10 * time.Second, max: 60 * time.Second, owns: []string{"hook"}},
}

func kindOf(name string) kind {
	for _, k := range Kinds {
		if k.name == name {
			return k
		}
	}
	return kind{name: name}
}

// ScheduleOptions shape a schedule.
type ScheduleOptions struct {
	// MeanGap is the mean time between two faults' starts (exponential).
	MeanGap time.Duration
	// MaxActive is the most faults under way (or within their tail) at
	// once.
	MaxActive int
	// Start is when the first fault may come.
	Start time.Duration
	// Only, when set, limits the kinds to those named.
	Only []string
}

// DefaultSchedule is the soak's.
var DefaultSchedule = ScheduleOptions{MeanGap: 4 * time.Second, MaxActive: 4, Start: 5 * time.Second}

// Schedule is the nemesis's faults for seed over d: a pure function of
// its arguments, so the same seed replays the same faults, and a shorter
// run's schedule is the start of a longer one's. Every fault ends by d.
func Schedule(seed uint64, d time.Duration, o ScheduleOptions) []Fault {
	rng := rand.New(rand.NewPCG(seed, 0x736f616b6e656d65))
	kinds := Kinds
	if len(o.Only) > 0 {
		kinds = nil
		for _, k := range Kinds {
			if slices.Contains(o.Only, k.name) {
				kinds = append(kinds, k)
			}
		}
	}
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	var out []Fault
	at := o.Start
	for total > 0 {
		// Every draw is made whatever happens to it, so that the draws
		// line up the same way for a seed.
		gap := time.Duration(rng.ExpFloat64() * float64(o.MeanGap))
		pick := rng.IntN(total)
		frac := rng.Float64()
		arg := rng.IntN(1 << 16)
		at += max(gap, 200*time.Millisecond).Round(100 * time.Millisecond)
		if at >= d {
			break
		}
		var k kind
		for _, c := range kinds {
			if pick < c.weight {
				k = c
				break
			}
			pick -= c.weight
		}
		dur := (k.min + time.Duration(frac*float64(k.max-k.min))).Round(100 * time.Millisecond)
		if len(k.args) > 0 {
			arg %= len(k.args)
		} else {
			arg = 0
		}
		f := Fault{N: len(out) + 1, At: at, Kind: k.name, For: dur, Arg: arg}
		if at+dur+k.tail > d || !fits(out, f, o.MaxActive) {
			continue
		}
		out = append(out, f)
	}
	return out
}

// fits reports whether f may join the faults planned so far.
func fits(planned []Fault, f Fault, maxActive int) bool {
	k := kindOf(f.Kind)
	end := f.At + f.For + k.tail
	active := 0
	for _, p := range planned {
		pk := kindOf(p.Kind)
		pend := p.At + p.For + pk.tail
		if pend <= f.At || p.At >= end {
			continue
		}
		active++
		for _, r := range k.owns {
			if slices.Contains(pk.owns, r) || slices.Contains(pk.uses, r) {
				return false
			}
		}
		for _, r := range k.uses {
			if slices.Contains(pk.owns, r) {
				return false
			}
		}
	}
	return active < maxActive
}

// ScheduleText is a schedule as printed, one fault a line.
func ScheduleText(fs []Fault) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// ScheduleHash identifies a schedule (its text's SHA-256, 12 hex digits).
func ScheduleHash(fs []Fault) string {
	s := sha256.Sum256([]byte(ScheduleText(fs)))
	return hex.EncodeToString(s[:6])
}
