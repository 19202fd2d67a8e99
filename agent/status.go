package agent

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/clientapi"
	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// setCondition sets a condition, moving its transition time only when its
// status changes.
func (d *Daemon) setCondition(typ, status, reason, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setConditionLocked(typ, status, reason, msg)
}

// setConditionLocked is setCondition with d.mu held, for a change of the
// status that a reader must see whole (a rollback and its condition).
func (d *Daemon) setConditionLocked(typ, status, reason, msg string) {
	d.metrics.SetCondition(typ, status)
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

func (d *Daemon) removeCondition(typ string) {
	d.metrics.SetCondition(typ, "")
	d.mu.Lock()
	defer d.mu.Unlock()
	d.status.Conditions = slices.DeleteFunc(d.status.Conditions, func(c api.Condition) bool { return c.Type == typ })
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

// subsystems are the subsystems, in the order status lists them.
var subsystems = []string{plan.Nftables, plan.Links, plan.WireGuard, plan.Sysctls, plan.Routes}

// publish records the outcome of a sync in the status and the metrics, all
// of it read from the sync's report and the state it reached, and returns
// the errors of what failed.
func (d *Daemon) publish(why trigger, start time.Time, res netcfg.Result) []error {
	dur := time.Since(start)
	subs := make([]api.Subsystem, len(subsystems))
	at := map[string]int{}
	for i, name := range subsystems {
		subs[i] = api.Subsystem{Name: name}
		at[name] = i
	}
	failedObjs, pendingObjs, skippedObjs := []api.Object{}, []api.Object{}, []api.Object{}
	var failed, skipped []error
	var failedSubs []string
	total := 0
	for _, e := range res.Report {
		i, known := at[e.Subsystem]
		if e.Writes() && known {
			subs[i].Changes++
			total++
		}
		switch {
		case e.Failed():
			failed = append(failed, e.Err)
			failedObjs = append(failedObjs, api.Object{Subsystem: e.Subsystem, Message: e.Err.Error()})
			if known && subs[i].Error == "" {
				subs[i].Error = e.Err.Error()
				failedSubs = append(failedSubs, e.Subsystem)
			}
		case e.Pending():
			pendingObjs = append(pendingObjs, api.Object{Subsystem: e.Subsystem, Message: e.Err.Error()})
		case e.Skipped():
			skipped = append(skipped, e.Err)
			skippedObjs = append(skippedObjs, api.Object{Subsystem: e.Subsystem, Message: e.Err.Error()})
		}
	}
	// Drift is a change to the kernel that the running config did not
	// ask for: what a sync woken by the kernel (or a resync) repairs, not
	// what a new config, a changed peer file or the first sync brings in.
	drift := (why == trigEvent || why == trigResync) && d.hash == d.syncedHash
	d.checkFights(drift, res)
	if drift && total > 0 {
		d.log.Info("drift repaired", "trigger", why.String(), "changes", total)
		repairs := netcfg.Repairs(res.Report)
		for kind, n := range repairs {
			d.metrics.DriftRepaired(kind, n)
		}
		// Whoever deleted it may have just shown itself: look for
		// hazards again (at most every repairLook: a storm of repairs
		// does not read networkd's files and /proc each time), then say
		// once per cause why, with its fix.
		if time.Since(d.hazardAt) >= repairLook {
			d.evalHazards()
		}
		d.nb.Causes(repairs)
	}
	d.syncedHash = d.hash
	replaced := nft.Replaced(res.Report)
	if len(replaced) > 0 {
		d.replaced = start.UTC().Format(time.RFC3339) + ": " + strings.Join(replaced, "; ")
		d.log.Warn("the firewall's update was refused; its table was replaced whole", "subsystem", plan.Nftables, "detail", strings.Join(replaced, "; "))
	}
	subs[at[plan.Nftables]].Note = d.replaced
	post := res.Post
	d.metrics.SetKillSwitchDrops(post.Nft.Observed.KillSwitchDrops.Packets)
	if !post.Empty() {
		d.log.Debug("not converged after the sync", "plan", post.String())
	}
	devs := clientapi.WithHeld(d.wgStatus.devices(post.WG), d.desired.At(time.Now()).WG)
	d.metrics.SyncDone(why.String(), dur, failedSubs)
	// Tunnel health is a PIA tunnel's (publishPIA sets it from the
	// provider); a plain device's peers show in the WireGuard series.
	d.metrics.SetWireGuard(devs)

	d.mu.Lock()
	d.status.Node = d.cfg.Node.Name
	if d.status.Node == "" {
		d.status.Node, _ = os.Hostname()
	}
	d.status.ConfigHash = d.hash
	d.status.Subsystems = subs
	d.status.Pending = pendingObjs
	d.status.Failed = failedObjs
	d.status.Skipped = skippedObjs
	d.status.WireGuard = devs
	d.mu.Unlock()

	d.checkHazards(res)
	if d.role != nil {
		c := d.role.Condition()
		d.setCondition(c.Type, c.Status, c.Reason, c.Message)
		rs := d.role.Status()
		d.mu.Lock()
		d.status.Gateway = &api.GatewayRole{Role: rs.Role, State: string(rs.State), Holder: rs.Holder, Since: rs.Since.UTC(), Reason: rs.Reason,
			LeaseOK: rs.LeaseOK, Transitions: rs.Transitions, TookOverSeconds: rs.TookOver.Seconds()}
		d.mu.Unlock()
	}
	waits, over := d.trackWaits(res)
	switch {
	case len(failed) > 0:
		d.setCondition(api.CondConverged, api.False, "SyncFailed", fmt.Sprintf("%d object(s) failed; first: %s", len(failed), failed[0]))
	case len(over) > 0:
		d.setCondition(api.CondConverged, api.False, "LinkMissing", fmt.Sprintf("for over %s: %s", d.o.PendingBound, over[0]))
	case len(pendingObjs) > 0:
		d.setCondition(api.CondConverged, api.True, "Pending", fmt.Sprintf("%d object(s) wait for a device or parent", len(pendingObjs)))
	default:
		d.setCondition(api.CondConverged, api.True, "Converged", "")
	}
	d.logSkipped(skippedObjs)
	switch {
	case len(skipped) > 0:
		d.setCondition(api.CondPeersConfigured, api.False, "Skipped", fmt.Sprintf("%d peer(s) skipped; first: %s", len(skipped), skipped[0]))
	case len(d.desired.WG.Devices) > 0 || d.condition(api.CondPeersConfigured) != nil:
		d.setCondition(api.CondPeersConfigured, api.True, "Configured", "")
	}
	fwd := res.Forwarding
	if f := fwd.String(); f != d.forwarding {
		switch {
		case len(fwd.Unprotected) > 0:
			d.log.Error(f, "subsystem", plan.Sysctls)
		case f != "":
			d.log.Warn(f, "subsystem", plan.Sysctls, "held", fwd.Held)
		default:
			d.log.Info("kill switch armed; forwarding follows the config", "subsystem", plan.Sysctls)
		}
		d.forwarding = f
	}
	d.metrics.SetForwardingUnprotected(len(fwd.Unprotected) > 0)
	if len(d.desired.Nft.KillSwitch) > 0 {
		notIn := strings.Join(post.Nft.Report().Lines(), "\n")
		if why := subs[at[plan.Nftables]].Error; why != "" {
			// The kernel's reason first: what is missing says little
			// about why.
			notIn = why + "\n" + notIn
		}
		switch {
		case post.Nft.Empty() && !fwd.KillSwitchDown && len(replaced) > 0:
			d.setCondition(api.CondKillSwitchArmed, api.True, "ArmedByReplacement", strings.Join(replaced, "; "))
		case post.Nft.Empty() && !fwd.KillSwitchDown:
			d.setCondition(api.CondKillSwitchArmed, api.True, "Armed", "")
		case len(fwd.Unprotected) > 0:
			d.setCondition(api.CondKillSwitchArmed, api.False, "ForwardingUnprotected", fwd.String()+"; "+notIn)
		case fwd.KillSwitchDown:
			d.setCondition(api.CondKillSwitchArmed, api.False, "ForwardingHeld", fwd.String()+"; "+notIn)
		default:
			d.setCondition(api.CondKillSwitchArmed, api.False, "NotInKernel", notIn)
		}
	}
	switch {
	case len(failed) == 0 && len(waits) > 0:
		d.setCondition(api.CondReady, api.False, "WaitingForLink", waits[0].String())
	case len(failed) == 0:
		d.setCondition(api.CondReady, api.True, "Converged", "")
	case !d.ready:
		d.setCondition(api.CondReady, api.False, "SyncFailed", failed[0].Error())
	default:
		d.setCondition(api.CondReady, api.False, "Degraded", failed[0].Error())
	}
	d.publishPIA()
	// Last, with the health it gives, so that whoever sees this sync in
	// status sees its conditions too (a client waiting for the next sync
	// read PeersConfigured of the one before).
	d.mu.Lock()
	d.setLastSync(why, start, dur, total)
	healthy := d.healthLocked()
	d.mu.Unlock()
	d.metrics.SetReady(healthy)
	d.labeler.Update(d.snapshot(start, post, devs))
	if c := d.labeler.Condition(); c.Type != "" {
		d.metrics.SetCondition(c.Type, c.Status)
	}
	return failed
}

// setLastSync records a finished sync in status (d.mu held).
func (d *Daemon) setLastSync(why trigger, start time.Time, dur time.Duration, changes int) {
	var count int64 = 1
	if d.status.LastSync != nil {
		count = d.status.LastSync.Count + 1
	}
	d.status.LastSync = &api.Sync{Time: start.UTC(), DurationMS: float64(dur.Microseconds()) / 1000, Trigger: why.String(), Changes: changes, Count: count}
}

// publishPeers is publish for syncPeers: the sync's time and changes,
// and the peers it wrote patched into the status's devices (the other
// peers' counters and handshakes are as the last full sync read them).
func (d *Daemon) publishPeers(why trigger, start time.Time, ops []wg.Op, rep plan.Report) {
	changes := 0
	var failedSubs []string
	for _, e := range rep {
		if e.Writes() {
			changes++
		}
		if e.Failed() && !slices.Contains(failedSubs, e.Subsystem) {
			failedSubs = append(failedSubs, e.Subsystem)
		}
	}
	d.mu.Lock()
	ws := slices.Clone(d.status.WireGuard)
	for i := range ws {
		cloned := false
		for _, o := range ops {
			if o.Device != ws[i].Name {
				continue
			}
			if !cloned {
				ws[i].Peers = slices.Clone(ws[i].Peers)
				cloned = true
			}
			k := o.PeerID.String()
			at, found := slices.BinarySearchFunc(ws[i].Peers, k, func(p api.WireGuardPeer, k string) int { return strings.Compare(p.PublicKey, k) })
			if o.Kind == wg.OpRemovePeer {
				if found {
					ws[i].Peers = slices.Delete(ws[i].Peers, at, at+1)
				}
				continue
			}
			ps := api.WireGuardPeer{PublicKey: k, HandshakeAgeSeconds: -1}
			if found {
				ps = ws[i].Peers[at]
			}
			ps.Name = o.Peer.Name
			ps.AllowedIPs = make([]string, 0, len(o.Peer.AllowedIPs))
			for _, a := range o.Peer.AllowedIPs {
				ps.AllowedIPs = append(ps.AllowedIPs, a.String())
			}
			if found {
				ws[i].Peers[at] = ps
			} else {
				ws[i].Peers = slices.Insert(ws[i].Peers, at, ps)
			}
		}
	}
	d.status.WireGuard = clientapi.WithHeld(ws, d.desired.At(time.Now()).WG)
	d.metrics.SetWireGuard(d.status.WireGuard)
	dur := time.Since(start)
	d.setLastSync(why, start, dur, changes)
	d.mu.Unlock()
	d.metrics.SyncDone(why.String(), dur, failedSubs)
}

// logSkipped logs each skipped entry once, when it first appears, and
// says when all of them are gone: a bad peer file is not news on every
// sync.
func (d *Daemon) logSkipped(skipped []api.Object) {
	now := make(map[string]bool, len(skipped))
	for _, o := range skipped {
		now[o.Message] = true
		if !d.skipped[o.Message] {
			d.log.Warn("skipped", "subsystem", o.Subsystem, "object", o.Message)
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
		if isPIA, healthy := d.piaHealthy(dev.Name); isPIA {
			// A PIA tunnel is healthy when its provider says so: a
			// registration the server has forgotten still shows a
			// recent handshake for a while.
			conds["wireguard/"+dev.Name+"/healthy"] = healthy
			continue
		}
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
		for _, c := range s.Degrading() {
			why = append(why, c.Type+"="+c.Reason)
		}
		summary = "degraded: " + strings.Join(why, ", ")
	}
	return kube.Snapshot{Conditions: conds, WireGuard: devs, PIAPorts: d.piaPorts(), Summary: summary, At: at}
}

// refreshHealth derives Ready and Degraded from the conditions: ready once
// the node converged with nothing failing; degraded while any condition
// but those of api.NotDegrading is False (the last sync failed, a reload
// was rejected, a change was rolled back, a port not delivered, ...).
func (d *Daemon) refreshHealth() {
	d.mu.Lock()
	healthy := d.healthLocked()
	d.mu.Unlock()
	d.metrics.SetReady(healthy)
}

// healthLocked is refreshHealth with d.mu held; it returns whether the
// node is ready and not degraded, for the metric.
func (d *Daemon) healthLocked() bool {
	s := &d.status
	isFalse := func(typ string) bool { c := s.Condition(typ); return c != nil && c.Status == api.False }
	s.Ready = !isFalse(api.CondReady) && s.LastSync != nil
	s.Degraded = len(s.Degrading()) > 0 // api.NotDegrading says which do not
	return s.Ready && !s.Degraded
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
