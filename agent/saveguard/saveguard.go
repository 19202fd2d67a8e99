// Package saveguard decides which config changes a saved file may bring in
// by itself. A file changes under a running daemon for bad reasons as well
// as good ones: config management that failed half-way, a `>` typed for
// `>>`, a full disk, an editor's truncated save. Applied at once, such a
// file tears the node down, kill switch included. So a change that takes
// away wholesale (every object of a kind, or a kill switch) is held until
// an operator asks for it (nodeagentctl reload, SIGHUP), and an empty file
// is never a config.
package saveguard

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// Empty reports whether a config file's bytes hold nothing but white
// space: what a truncating write, a failed one or a full disk leaves. A
// config that means "nothing" says so in a comment or with `{}`.
func Empty(raw []byte) bool {
	return len(bytes.TrimSpace(raw)) == 0
}

// EmptyError is the error for an empty config file.
func EmptyError(file string) error {
	return config.ErrorList{{File: file, Line: 1, Msg: "the file is empty (a truncated or failed write?); a config that declares nothing is written as `{}` or as comments, and an empty file is never applied"}}
}

// kind is one kind of object a config declares, counted.
type kind struct {
	name  string // as the config spells the list
	count func(c *config.Config) int
}

var kinds = []kind{
	{"vlans", func(c *config.Config) int { return len(c.VLANs) }},
	{"macvlans", func(c *config.Config) int { return len(c.Macvlans) }},
	{"wireguard", func(c *config.Config) int { return len(c.WireGuard) }},
	{"routing.tables", func(c *config.Config) int { return len(c.Routing.Tables) }},
	{"routing.rules", func(c *config.Config) int { return len(c.Routing.Rules) }},
	{"firewall.masquerade", func(c *config.Config) int { return len(c.Firewall.Masquerade) }},
	{"firewall.snat", func(c *config.Config) int { return len(c.Firewall.SNAT) }},
	{"firewall.forward", func(c *config.Config) int { return len(c.Firewall.Forward) }},
	{"firewall.killSwitch", func(c *config.Config) int { return len(c.Firewall.KillSwitch) }},
	{"firewall.mssClamp", func(c *config.Config) int { return len(c.Firewall.MSSClamp) }},
	{"sysctls", func(c *config.Config) int { return len(c.Sysctls) }},
	{"kubernetes.labels", func(c *config.Config) int {
		return len(c.Kubernetes.Labels) + len(c.Kubernetes.ConditionalLabels)
	}},
}

// Objects counts the objects c declares, of every kind.
func Objects(c *config.Config) int {
	n := 0
	for _, k := range kinds {
		n += k.count(c)
	}
	return n
}

// Risks lists what applying next in place of running would take away
// wholesale, one line each: every object (next declares none), every
// object of a kind, a kill-switch table disarmed or gone, a firewall kill
// switch gone, a source no longer sent into a kill-switch table. None
// (nil) for an ordinary change, which a save applies at once.
func Risks(running, next *config.Config) []string {
	if running == nil || next == nil {
		return nil
	}
	var out []string
	if had := Objects(running); had > 0 && Objects(next) == 0 {
		out = append(out, fmt.Sprintf("it declares no objects: applied, it would remove all %d that the running config declares", had))
	} else {
		for _, k := range kinds {
			if had := k.count(running); had > 0 && k.count(next) == 0 {
				out = append(out, fmt.Sprintf("it removes every entry of %s (%d)", k.name, had))
			}
		}
	}
	armed := killSwitchTables(next)
	for _, t := range running.Routing.Tables {
		if t.KillSwitch && !armed[t.ID] {
			out = append(out, fmt.Sprintf("it disarms the kill switch of routing table %s", tableName(t)))
		}
	}
	keep := map[string]bool{}
	for _, k := range next.Firewall.KillSwitch {
		keep[k.From] = true
	}
	for _, k := range running.Firewall.KillSwitch {
		if !keep[k.From] {
			out = append(out, fmt.Sprintf("it drops the firewall kill switch for %s", k.From))
		}
	}
	// A source the running config sends into a kill-switch table, and
	// next does not: its traffic would leave by the main table.
	runningKS, nextKS := killSwitchTables(running), armed
	still := map[string]bool{}
	for _, r := range next.Routing.Rules {
		if nextKS[r.Table] {
			still[r.From] = true
		}
	}
	for _, r := range running.Routing.Rules {
		if runningKS[r.Table] && r.From != "" && !still[r.From] {
			out = append(out, fmt.Sprintf("it no longer sends %s into kill-switch table %d (rule %d)", r.From, r.Table, r.Priority))
		}
	}
	return slices.Compact(out)
}

func killSwitchTables(c *config.Config) map[int]bool {
	out := map[int]bool{}
	for _, t := range c.Routing.Tables {
		if t.KillSwitch {
			out[t.ID] = true
		}
	}
	return out
}

func tableName(t config.Table) string {
	if t.Name != "" {
		return strconv.Itoa(t.ID) + " (" + t.Name + ")"
	}
	return strconv.Itoa(t.ID)
}

// Summary joins risks for one log line or condition message.
func Summary(risks []string) string {
	return strings.Join(risks, "; ")
}
