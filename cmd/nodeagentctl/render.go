package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/nodeagent/nodeagent/agent/api"
)

// renderStatus writes s as the readable report of `nodeagentctl status`.
// Times are shown in now's location and ages relative to now, so a test
// that fixes now gets the same text every run.
func renderStatus(w io.Writer, s *api.Status, now time.Time) error {
	var b strings.Builder
	field := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%11s: %s\n", label, fmt.Sprintf(format, args...))
	}
	field("Node", "%s", clean(s.Node))
	field("State", "%s", stateLine(s))
	field("Version", "%s", clean(s.Version))
	field("Config", "%s (hash %s)", clean(s.ConfigFile), clean(s.ConfigHash))
	if ls := s.LastSync; ls != nil {
		field("Last sync", "%s, trigger %s, took %s, %d changes, sync #%d",
			stamp(ls.Time, now), clean(ls.Trigger), millis(ls.DurationMS), ls.Changes, ls.Count)
	} else {
		field("Last sync", "none yet")
	}
	field("Started", "%s", stamp(s.Started, now))

	b.WriteString("\nConditions:\n")
	if len(s.Conditions) == 0 {
		b.WriteString("  none reported\n")
	} else {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
		for _, c := range s.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", clean(c.Type), clean(c.Status), dash(c.Reason), ageShort(c.LastTransitionTime, now), clean(c.Message))
		}
		tw.Flush()
	}

	if len(s.Subsystems) > 0 {
		b.WriteString("\nSubsystems:\n")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tCHANGES\tERROR")
		for _, ss := range s.Subsystems {
			fmt.Fprintf(tw, "  %s\t%d\t%s\n", clean(ss.Name), ss.Changes, dash(ss.Error))
		}
		tw.Flush()
		for _, ss := range s.Subsystems {
			if ss.Note != "" {
				fmt.Fprintf(&b, "  note: %s: %s\n", clean(ss.Name), clean(ss.Note))
			}
		}
	}

	if len(s.WireGuard) > 0 {
		b.WriteString("\nWireGuard:\n")
		renderDevices(&b, s.WireGuard, now, "  ")
	}

	for _, t := range s.PIA {
		renderPIA(&b, t, now)
	}
	if g := s.Gateway; g != nil {
		fmt.Fprintf(&b, "\nGateway role %s:\n", clean(g.Role))
		holder := clean(g.Holder)
		if holder == "" {
			holder = "none"
		}
		lease := "read within its duration"
		if !g.LeaseOK {
			lease = "NOT read within its duration (the API server?)"
		}
		fmt.Fprintf(&b, "  state %s since %s; Lease holder %s, %s; %d transitions", clean(g.State), stamp(g.Since, now), holder, lease, g.Transitions)
		if g.TookOverSeconds > 0 {
			fmt.Fprintf(&b, "; last take-over took %s", millis(g.TookOverSeconds*1000))
		}
		fmt.Fprintf(&b, "\n  %s\n", clean(g.Reason))
	}

	for _, objs := range []struct {
		title string
		list  []api.Object
	}{{"Pending", s.Pending}, {"Skipped", s.Skipped}, {"Failed", s.Failed}} {
		if len(objs.list) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:\n", objs.title)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, o := range objs.list {
			fmt.Fprintf(tw, "  %s\t%s\n", clean(o.Subsystem), clean(o.Message))
		}
		tw.Flush()
	}

	if len(s.Warnings) > 0 {
		b.WriteString("\nWarnings (the config validates, but):\n")
		for _, w := range s.Warnings {
			fmt.Fprintf(&b, "  %s\n", clean(w))
		}
	}
	if r := s.LastRejected; r != nil {
		fmt.Fprintf(&b, "\nLast rejected reload: %s, %s\n", stamp(r.Time, now), clean(r.File))
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "  %s\n", clean(e))
		}
	}
	if r := s.LastRollback; r != nil {
		fmt.Fprintf(&b, "\nLast rollback: %s, probe %s failed after the change; config %s is not retried until it changes\n",
			stamp(r.Time, now), clean(r.Probe), clean(r.ConfigHash))
		if r.Message != "" {
			fmt.Fprintf(&b, "  %s\n", clean(r.Message))
		}
	}
	_, err := io.WriteString(w, trimLines(b.String()))
	return err
}

// renderPIA writes one PIA tunnel's provider state.
func renderPIA(b *strings.Builder, t api.PIATunnel, now time.Time) {
	state := clean(t.Phase)
	if t.Healthy {
		state = "healthy"
	}
	fmt.Fprintf(b, "\nPIA %s: %s, region %s\n", clean(t.Device), state, dash(t.Region))
	field := func(label, format string, args ...any) {
		fmt.Fprintf(b, "  %-18s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	opt := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return stamp(*t, now)
	}
	if t.ServerCN != "" {
		field("server", "%s (%s), inside the tunnel %s", clean(t.ServerCN), dash(t.ServerIP), dash(t.ServerVIP))
		field("peer IP", "%s", dash(t.PeerIP))
		field("registered since", "%s", opt(t.RegisteredSince))
	}
	hs := "none yet"
	if t.LastHandshake != nil {
		hs = ago(*t.LastHandshake, now)
	}
	field("last handshake", "%s", hs)
	field("next token", "%s", opt(t.NextTokenRefresh))
	if t.ServerList != "" {
		field("server list", "%s", clean(t.ServerList))
	}
	if t.ForwardedPort != 0 {
		field("forwarded port", "%d, bound %s, signature until %s", t.ForwardedPort, opt(t.LastBind), opt(t.PortExpires))
	}
	if l := t.PortLost; l != nil {
		at := l.Since
		field("forwarded port", "lost: %d since %s (last good bind %s); no DNAT, file or metric until a port is bound again", l.Port, opt(&at), opt(t.LastBind))
	} else if t.PortTroubleSince != nil && t.ForwardedPort != 0 {
		field("port trouble", "not kept bound since %s (lost after 15 minutes of it)", opt(t.PortTroubleSince))
	}
	if t.PortError != "" {
		field("port error", "%s", clean(t.PortError))
	}
	if h := t.PortHook; h != nil {
		renderPortHook(field, opt, h)
	}
	if t.DNS != "" {
		field("DNS", "%s (through the tunnel)", clean(t.DNS))
	}
	if t.ProbeFailures > 0 {
		field("probes unanswered", "%d", t.ProbeFailures)
	}
	if t.LastError != "" {
		field("last error", "%s: %s", opt(t.LastErrorAt), clean(t.LastError))
	}
	if t.RetryAt != nil {
		field("retry", "%s", stamp(*t.RetryAt, now))
	}
}

// renderPortHook writes a PIA tunnel's port hook (onChange) lines.
func renderPortHook(field func(label, format string, args ...any), opt func(*time.Time) string, h *api.PortHook) {
	var state string
	switch {
	case h.Port == 0 && !h.Lost:
		state = "no port yet"
	case h.Delivered && h.Lost:
		state = "told the port is lost"
	case h.Delivered:
		state = fmt.Sprintf("delivered port %d", h.Port)
	case h.Running:
		state = "running"
	case h.Held:
		state = fmt.Sprintf("credentials refused %d times in a row: not run again until fixed and `nodeagentctl port --retry`", h.Refused)
	case h.Refused > 0:
		state = "credentials refused"
	case h.Attempts > 0:
		state = "failing"
	default:
		state = "due"
	}
	if h.Attempts > 0 {
		state += fmt.Sprintf(", %d failed attempts", h.Attempts)
	}
	field("port hook", "%s", state)
	if h.LastRun != nil {
		took := ""
		if h.LastTookSeconds != nil {
			took = fmt.Sprintf(", took %.1fs", *h.LastTookSeconds)
		}
		field("hook last run", "%s, %s%s", opt(h.LastRun), dash(h.LastExit), took)
	}
	if h.LastError != "" {
		field("hook error", "%s", clean(h.LastError))
	}
	if h.NextRun != nil {
		field("hook next run", "%s", opt(h.NextRun))
	}
}

// trimLines drops the padding tabwriter leaves after an empty last cell.
func trimLines(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if body, ok := strings.CutSuffix(l, "\n"); ok {
			lines[i] = strings.TrimRight(body, " ") + "\n"
		}
	}
	return strings.Join(lines, "")
}

// stateLine summarises readiness, naming the conditions that are not True
// so the reason is on the line the eye lands on.
func stateLine(s *api.Status) string {
	state := "ready"
	if !s.Ready {
		state = "not ready"
	}
	if s.Degraded {
		state += ", degraded"
	}
	var off []string
	for _, c := range s.Conditions {
		if c.Status != api.True {
			off = append(off, clean(c.Type)+"="+clean(c.Status))
		}
	}
	if len(off) > 0 {
		state += " (" + strings.Join(off, ", ") + ")"
	}
	return state
}

// renderPeers writes devs as the table of `nodeagentctl peers`, the same
// one status shows.
func renderPeers(w io.Writer, devs []api.WireGuardDevice, now time.Time) error {
	if len(devs) == 0 {
		_, err := io.WriteString(w, "no WireGuard devices\n")
		return err
	}
	var b strings.Builder
	renderDevices(&b, devs, now, "")
	_, err := io.WriteString(w, trimLines(b.String()))
	return err
}

// renderDevices writes one line per WireGuard device and a table of its
// peers, each line prefixed with indent.
func renderDevices(b *strings.Builder, devs []api.WireGuardDevice, now time.Time, indent string) {
	for i, d := range devs {
		if i > 0 {
			b.WriteString("\n")
		}
		impl := d.Implementation
		if impl == "" {
			impl = "absent"
		}
		line := fmt.Sprintf("%s%s (%s)", indent, clean(d.Name), clean(impl))
		if d.PublicKey != "" {
			line += ", public key " + clean(d.PublicKey)
		}
		if d.ListenPort != 0 {
			line += fmt.Sprintf(", listening on %d", d.ListenPort)
		}
		line += fmt.Sprintf(", %d/%d peers live", d.LivePeers, len(d.Peers))
		b.WriteString(line + "\n")
		for _, p := range d.Problems {
			fmt.Fprintf(b, "%s  problem: %s\n", indent, clean(p))
		}
		if len(d.Peers) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "%s  PEER\tSTATE\tENDPOINT\tHANDSHAKE\tRX\tTX\tALLOWED IPS\n", indent)
		for _, p := range d.Peers {
			name := clean(p.Name)
			if name == "" {
				name = shortKey(p.PublicKey)
			}
			fmt.Fprintf(tw, "%s  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", indent, name, peerState(p, now), dash(p.Endpoint), handshake(p, now),
				humanBytes(p.RxBytes), humanBytes(p.TxBytes), dash(strings.Join(p.AllowedIPs, ",")))
		}
		tw.Flush()
	}
}

// peerState is a peer's state for the table: live (a handshake in the
// last 3 minutes) or idle while it is in the device, with its expiry;
// disabled, or expired and since when, while its file keeps it out.
func peerState(p api.WireGuardPeer, now time.Time) string {
	var s string
	switch {
	case p.State == "expired" && p.Expires != nil:
		return "expired " + ago(*p.Expires, now)
	case p.State != "":
		return clean(p.State)
	case p.Live:
		s = "live"
	default:
		s = "idle"
	}
	if p.Expires != nil {
		s += ", expires in " + compact(p.Expires.Sub(now))
	}
	return s
}

// handshake is a peer's last handshake as an age, or "never".
func handshake(p api.WireGuardPeer, now time.Time) string {
	if p.LastHandshake == nil || p.LastHandshake.IsZero() || p.HandshakeAgeSeconds < 0 {
		return "never"
	}
	return ago(*p.LastHandshake, now)
}

// shortKey abbreviates a public key to a prefix that is still unique in
// practice, as a peer's name when it has none.
func shortKey(k string) string {
	k = clean(k)
	if len(k) <= 10 {
		return dash(k)
	}
	return k[:10] + "…"
}

// stamp is t in now's location with its age, e.g.
// "2026-12-01 08:59:48 UTC (12s ago)".
func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.In(now.Location()).Format("2006-01-02 15:04:05 MST") + " (" + ago(t, now) + ")"
}

// ago is the age of t, e.g. "12s ago", or "in 3s" for a time after now (the
// daemon's clock and ours are the same clock, but it may have stepped).
func ago(t, now time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		return "in " + compact(-d)
	}
	return compact(d) + " ago"
}

// ageShort is ago without the suffix, for AGE columns.
func ageShort(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "-" + compact(-d)
	}
	return compact(d)
}

// compact formats d with its two largest units, truncated, so ages keep
// a stable width: 12s, 5m3s, 2h5m, 3d4h.
func compact(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// millis formats a duration in milliseconds, e.g. "41ms", "1.204s", "350µs".
func millis(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	if d >= time.Millisecond {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// humanBytes formats n in IEC units as wg(8) does: "0 B", "1.50 KiB".
func humanBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= 1024
		if v < 1024 || unit == "TiB" {
			return fmt.Sprintf("%.2f %s", v, unit)
		}
	}
	panic("unreachable")
}

// dash is clean(s), or "-" for an empty cell so columns stay aligned.
func dash(s string) string {
	if s = clean(s); s == "" {
		return "-"
	}
	return s
}

// clean replaces control characters with spaces. Messages can quote
// file contents (a peer file's name, a config line); a tab would break the
// table and an escape sequence would reach the terminal.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}
