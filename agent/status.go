package agent

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// setCondition sets a condition, moving its transition time only when its
// status changes.
func (d *Daemon) setCondition(typ, status, reason, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.status.Conditions {
		c := &d.status.Conditions[i]
		if c.Type == typ {
			if c.Status != status {
				c.LastTransitionTime = time.Now().UTC()
			}
			c.Status, c.Reason, c.Message = status, reason, msg
			return
		}
	}
	d.status.Conditions = append(d.status.Conditions, api.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: time.Now().UTC()})
}

func (d *Daemon) condition(typ string) *api.Condition {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.status.Condition(typ); c != nil {
		cc := *c
		return &cc
	}
	return nil
}

// publish records the outcome of a sync in the status and the metrics.
func (d *Daemon) publish(trigger string, start time.Time, applied, post netcfg.Plans, pending, skipped, failed []error) {
	dur := time.Since(start)
	changes := func(s string) int {
		n := 0
		for _, l := range strings.Split(s, "\n") {
			if l != "" && l[0] != '!' {
				n++
			}
		}
		return n
	}
	subs := []api.Subsystem{
		{Name: "nftables", Changes: changes(applied.Nft.String())},
		{Name: "links", Changes: changes(applied.Link.String())},
		{Name: "wireguard", Changes: changes(applied.WG.String())},
		{Name: "sysctls", Changes: changes(applied.Sysctl.String())},
		{Name: "routes", Changes: changes(applied.Route.String())},
	}
	var failedSubs []string
	objs := func(errs []error) []api.Object {
		out := []api.Object{}
		for _, e := range errs {
			sub := subsystemOf(e.Error())
			out = append(out, api.Object{Subsystem: sub, Message: e.Error()})
		}
		return out
	}
	failedObjs := objs(failed)
	for _, o := range failedObjs {
		for i := range subs {
			if subs[i].Name == o.Subsystem && subs[i].Error == "" {
				subs[i].Error = o.Message
				failedSubs = append(failedSubs, o.Subsystem)
			}
		}
	}
	total := 0
	for _, s := range subs {
		total += s.Changes
	}
	// Drift is a change to the kernel that the running config did not
	// ask for: what a sync woken by the kernel (or a resync) repairs, not
	// what a new config, a changed peer file or the first sync brings in.
	if (trigger == "event" || trigger == "resync") && d.hash == d.syncedHash && total > 0 {
		d.log.Info("drift repaired", "trigger", trigger, "changes", total)
		for kind, n := range applied.Repairs() {
			d.metrics.DriftRepaired(kind, n)
		}
	}
	d.syncedHash = d.hash
	d.metrics.SetKillSwitchDrops(post.Nft.Observed.KillSwitchDrops.Packets)
	if !post.Empty() {
		d.log.Debug("not converged after the sync", "plan", post.String())
	}
	devs := wireGuardDevices(wg.States(post.WG))
	d.metrics.SyncDone(trigger, dur, failedSubs)
	d.metrics.SetWireGuard(devs)
	for _, dev := range devs {
		healthy := dev.Implementation != "" && (len(dev.Peers) == 0 || dev.LivePeers > 0)
		d.metrics.SetTunnelHealthy(dev.Name, healthy)
	}

	d.mu.Lock()
	var count int64 = 1
	if d.status.LastSync != nil {
		count = d.status.LastSync.Count + 1
	}
	d.status.Node = d.cfg.Node.Name
	if d.status.Node == "" {
		d.status.Node, _ = os.Hostname()
	}
	d.status.ConfigHash = d.hash
	d.status.LastSync = &api.Sync{Time: start.UTC(), DurationMS: float64(dur.Microseconds()) / 1000, Trigger: trigger, Changes: total, Count: count}
	d.status.Subsystems = subs
	d.status.Pending = objs(pending)
	d.status.Failed = failedObjs
	d.status.Skipped = objs(skipped)
	d.status.WireGuard = devs
	d.mu.Unlock()

	if len(failed) > 0 {
		d.setCondition(api.CondConverged, api.False, "SyncFailed", fmt.Sprintf("%d object(s) failed; first: %s", len(failed), failed[0]))
	} else if len(pending) > 0 {
		d.setCondition(api.CondConverged, api.True, "Pending", fmt.Sprintf("%d object(s) wait for a device or parent", len(pending)))
	} else {
		d.setCondition(api.CondConverged, api.True, "Converged", "")
	}
	d.logSkipped(skipped)
	switch {
	case len(skipped) > 0:
		d.setCondition(api.CondPeersConfigured, api.False, "Skipped", fmt.Sprintf("%d peer(s) skipped; first: %s", len(skipped), skipped[0]))
	case len(d.desired.WG.Devices) > 0 || d.condition(api.CondPeersConfigured) != nil:
		d.setCondition(api.CondPeersConfigured, api.True, "Configured", "")
	}
	fwd := applied.Forwarding
	if f := fwd.String(); f != d.forwarding {
		switch {
		case len(fwd.Unprotected) > 0:
			d.log.Error(f, "subsystem", "sysctls")
		case f != "":
			d.log.Warn(f, "subsystem", "sysctls", "held", fwd.Held)
		default:
			d.log.Info("kill switch armed; forwarding follows the config", "subsystem", "sysctls")
		}
		d.forwarding = f
	}
	d.metrics.SetForwardingUnprotected(len(fwd.Unprotected) > 0)
	if len(d.desired.Nft.KillSwitch) > 0 {
		switch {
		case post.Nft.Empty() && !fwd.KillSwitchDown:
			d.setCondition(api.CondKillSwitchArmed, api.True, "Armed", "")
		case len(fwd.Unprotected) > 0:
			d.setCondition(api.CondKillSwitchArmed, api.False, "ForwardingUnprotected", fwd.String()+"; "+strings.TrimSpace(post.Nft.String()))
		case fwd.KillSwitchDown:
			d.setCondition(api.CondKillSwitchArmed, api.False, "ForwardingHeld", fwd.String()+"; "+strings.TrimSpace(post.Nft.String()))
		default:
			d.setCondition(api.CondKillSwitchArmed, api.False, "NotInKernel", strings.TrimSpace(post.Nft.String()))
		}
	}
	switch {
	case len(failed) == 0:
		d.setCondition(api.CondReady, api.True, "Converged", "")
	case !d.ready:
		d.setCondition(api.CondReady, api.False, "SyncFailed", failed[0].Error())
	default:
		d.setCondition(api.CondReady, api.False, "Degraded", failed[0].Error())
	}
	d.refreshHealth()
	d.labeler.Update(d.snapshot(start, post, devs))
}

// logSkipped logs each skipped entry once, when it first appears, and
// says when all of them are gone: a bad peer file is not news on every
// sync.
func (d *Daemon) logSkipped(skipped []error) {
	now := make(map[string]bool, len(skipped))
	for _, e := range skipped {
		msg := e.Error()
		now[msg] = true
		if !d.skipped[msg] {
			d.log.Warn("skipped", "subsystem", subsystemOf(msg), "object", msg)
		}
	}
	if len(now) == 0 && len(d.skipped) > 0 {
		d.log.Info("nothing skipped any more")
	}
	d.skipped = now
}

// snapshot is what the Node's labels and annotations follow: the
// conditions conditionalLabels name (wireguard/DEV/healthy, vlan/NAME/up,
// checks/arp-reachable, converged), the WireGuard status and a one-line
// summary with no counters or times (every change of it is a Node write).
func (d *Daemon) snapshot(at time.Time, post netcfg.Plans, devs []api.WireGuardDevice) kube.Snapshot {
	conds := map[string]bool{}
	for _, dev := range devs {
		conds["wireguard/"+dev.Name+"/healthy"] = dev.Implementation != "" && (len(dev.Peers) == 0 || dev.LivePeers > 0)
	}
	for _, v := range d.cfg.VLANs {
		l, ok := post.Link.Observed.Links[v.Name]
		conds["vlan/"+v.Name+"/up"] = ok && l.Up && l.Owned
	}
	s := d.Status()
	isTrue := func(typ string) bool { c := s.Condition(typ); return c != nil && c.Status == api.True }
	conds["checks/arp-reachable"] = isTrue(api.CondARPReachable)
	conds["converged"] = isTrue(api.CondConverged)
	summary := "converged"
	switch {
	case !s.Ready:
		summary = "not ready"
	case s.Degraded:
		var why []string
		for _, c := range s.Conditions {
			if c.Status == api.False && c.Type != api.CondLabelsSynced {
				why = append(why, c.Type+"="+c.Reason)
			}
		}
		summary = "degraded: " + strings.Join(why, ", ")
	}
	return kube.Snapshot{Conditions: conds, WireGuard: devs, Summary: summary, At: at}
}

// refreshHealth derives Ready and Degraded from the conditions: ready once
// the node converged with nothing failing; degraded while the last sync
// failed, a reload was rejected, or a change was rolled back.
func (d *Daemon) refreshHealth() {
	d.mu.Lock()
	s := &d.status
	isFalse := func(typ string) bool { c := s.Condition(typ); return c != nil && c.Status == api.False }
	s.Ready = !isFalse(api.CondReady) && s.LastSync != nil
	s.Degraded = isFalse(api.CondConverged) || isFalse(api.CondConfigLoaded) || isFalse(api.CondSafeApply) || isFalse(api.CondKillSwitchArmed) || isFalse(api.CondARPReachable) || isFalse(api.CondPeersConfigured)
	healthy := s.Ready && !s.Degraded
	d.mu.Unlock()
	d.metrics.SetReady(healthy)
}

// subsystemOf guesses the subsystem of an error from how each names its
// objects.
func subsystemOf(msg string) string {
	switch {
	case strings.HasPrefix(msg, "nft"):
		return "nftables"
	case strings.HasPrefix(msg, "wireguard"):
		return "wireguard"
	case strings.HasPrefix(msg, "link"), strings.HasPrefix(msg, "address"):
		return "links"
	case strings.HasPrefix(msg, "sysctl"):
		return "sysctls"
	}
	return "routes"
}

// summary is the one-line STATUS= for systemd.
func (d *Daemon) summary() string {
	s := d.Status()
	state := "ready"
	switch {
	case !s.Ready:
		state = "not ready"
	case s.Degraded:
		state = "degraded"
	}
	line := fmt.Sprintf("%s; config %s", state, s.ConfigHash)
	if s.LastSync != nil {
		line += fmt.Sprintf("; last sync %s (%s, %d changes)", s.LastSync.Time.Format(time.RFC3339), s.LastSync.Trigger, s.LastSync.Changes)
	}
	if n := len(s.Failed); n > 0 {
		line += fmt.Sprintf("; %d failed", n)
	}
	if n := len(s.Pending); n > 0 {
		line += fmt.Sprintf("; %d pending", n)
	}
	return line
}
