package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
)

// sync is one pass: re-read the config if the trigger asks for it,
// observe once and plan once, let safe apply decide on that plan, apply
// exactly it, and publish what became of it and the state it reached.
func (d *Daemon) sync(ctx context.Context, why trigger) error {
	start := time.Now()
	switch {
	case why.rereads():
		// The register is read whole: the files the watch named are in it.
		if d.files != nil {
			d.files.take()
		}
		d.reload(why)
	case why == trigStart && d.files != nil && len(d.files.take()) > 0:
		// Register files changed between the load and the first sync.
		d.reload(trigResync)
	}
	d.standbyPIA()
	des := d.desired
	if d.hash == d.badHash && d.lastGood != nil {
		// Rolled back: keep the previous state until the config changes.
		des = *d.lastGood
	}
	des = d.effective(des)
	p, _ := d.cv.Plan(ctx, des) // what cannot be observed is in the plan
	if d.hash == d.syncedHash {
		// An object in a fight with another program waits for the next
		// resync (agent/fight); a new config repairs at once.
		p, _ = p.Hold(d.fights.Hold, "another program keeps changing it back: repaired once per resync until it stops (see the Conflict condition)")
	}
	if d.beforeApply != nil {
		d.beforeApply(p)
	}
	res := d.apply(ctx, des, p)
	if d.role != nil {
		d.role.SyncedFrom(res)
	}
	if d.stager != nil {
		// The first sync took the start-up's staging devices or not;
		// what it did not take is deleted.
		d.stager.Finish()
		d.stager = nil
	}
	if d.afterApply != nil {
		d.afterApply(p, res)
	}
	if why == trigStart || why == trigResync {
		d.checkARP(ctx)
	}
	if len(d.pia) > 0 {
		// The providers see the device as the sync left it (a new
		// registration configured, say) without waiting for the poll.
		if d.stepPIA(ctx, res.Post.WG.Observed) {
			d.kickNow(trigProvider)
		}
	}
	failed := d.publish(why, start, res)
	// A register file's change may be applied on its own (syncPeers)
	// only while the devices are as the desired state says.
	d.wgConverged = len(failed) == 0 && !res.Post.WG.Writes() && des.WG.Devices != nil
	if len(failed) > 0 {
		return errors.Join(failed...)
	}
	sum, first := d.summary(), !d.ready
	if first {
		d.ready = true
		// The first full convergence: what systemd's READY=1 (and so
		// units ordered after nodeagent) waited for.
		d.notify.Ready(sum)
	} else {
		d.notify.Status(sum)
	}
	d.logReady(sum, first)
	return nil
}

// logReady says in the journal what status says of readiness, in the
// same words: "node ready" once the Ready condition is True (at the
// first sync that makes it so), and when the first sync that converged
// (first) leaves it False, "first sync done; the node is not ready" with
// the reason (an object waiting for a link the config does not create),
// although systemd is told READY=1 then: the daemon has started.
func (d *Daemon) logReady(sum string, first bool) {
	if d.readyLogged {
		return
	}
	c := d.condition(api.CondReady)
	switch {
	case c != nil && c.Status == api.True:
		d.readyLogged = true
		d.log.Info("node ready", "status", sum)
	case first && c != nil:
		d.log.Warn("first sync done; the node is not ready", "reason", c.Reason, "why", c.Message, "status", sum)
	}
}

// syncPeers applies register files that changed (the file watch names
// them) on their own: each file is read, its peer diffed against the one
// it gave before, and that peer alone written, without reading the rest
// of the config, the other files or the kernel, so one changed peer among
// thousands costs about what `wg set` of it does. That is right only
// while the devices are as the desired state says and nothing else is
// due; otherwise, and for any change that could move another file's claim
// (netcfg.ApplyPeerFiles says which), it is a full sync.
func (d *Daemon) syncPeers(ctx context.Context, trig trigger) error {
	files := d.files.take()
	why := ""
	switch {
	case !d.ready || !d.wgConverged || d.failures > 0 || d.hash == d.badHash:
		why = "the last sync did not converge"
	case d.reading != nil:
		why = "a config read is still under way"
	case len(d.pia) > 0:
		why = "a PIA provider shapes the desired state"
	case d.cfg.Checks.SafeApplyOn() && probesViaWireGuard(d.host, d.cfg, d.wgNames()):
		why = "a safe-apply probe's traffic goes through a WireGuard device"
	}
	if why != "" {
		d.log.Debug("register change: full sync", "why", why)
		return d.sync(ctx, trigConfig)
	}
	start := time.Now()
	des, ops, rep, err := d.cv.ApplyPeerFiles(ctx, d.cfg, d.desired, files, d.o.Register)
	if need, ok := errors.AsType[*netcfg.NeedFullSync](err); ok {
		d.log.Debug("register change: full sync", "why", need.Reason)
		return d.sync(ctx, trigConfig)
	}
	d.desired = des
	if d.lastGood != nil && d.hash != d.badHash {
		good := des
		d.lastGood = &good
	}
	d.publishPeers(trig, start, ops, rep)
	if err := rep.Err(); err != nil {
		d.wgConverged = false
		return err
	}
	return nil
}

func (d *Daemon) wgNames() []string {
	var out []string
	for _, dev := range d.desired.WG.Devices {
		out = append(out, dev.Name)
	}
	return out
}

// apply carries out p, planned for des, with safe apply around a plan
// that touches links, routes, rules, nftables or WireGuard devices: the
// probes that pass before it are run again after it, and one that fails
// rolls back to the last good state. Safe apply decides on p itself, and
// what is applied is p.
func (d *Daemon) apply(ctx context.Context, des netcfg.Desired, p netcfg.Plans) netcfg.Result {
	if p.Empty() {
		return netcfg.Result{Report: p.Report(), Applied: p, Post: p}
	}
	var probes []Probe
	passed := map[string]bool{}
	if d.cfg.Checks.SafeApplyOn() && p.Touches() && d.lastGood != nil && d.hash != d.badHash {
		probes = Probes(d.host, d.cfg)
		failedBefore := runProbes(ctx, probes)
		for _, pr := range probes {
			passed[pr.Name] = failedBefore[pr.Name] == nil
		}
	}
	res := d.cv.Apply(ctx, p)
	if len(passed) > 0 {
		deadline := d.cfg.Checks.ProbeDeadline
		if deadline == 0 {
			deadline = 10 * time.Second
		}
		if name, perr := recheck(ctx, probes, passed, deadline); name != "" {
			d.log.Error("safe apply: a probe that passed before the change fails after it; rolling back", "probe", name, "err", perr, "config", d.hash)
			// The rollback is a plan of its own, against the state the
			// change reached.
			bp, _ := d.cv.Plan(ctx, *d.lastGood)
			back := d.cv.Apply(ctx, bp)
			d.badHash = d.hash
			d.metrics.RolledBack(name)
			// The rollback and its condition in one change of the
			// status: a reader never sees the one without the other.
			d.mu.Lock()
			d.status.LastRollback = &api.Rollback{Time: time.Now().UTC(), Probe: name, Message: perr.Error(), ConfigHash: d.hash}
			d.setConditionLocked(api.CondSafeApply, api.False, "RolledBack", fmt.Sprintf("probe %s failed after applying config %s (%v); rolled back, not retried until the config changes", name, d.hash, perr))
			d.mu.Unlock()
			return back
		}
	}
	// The state to roll back to is the last config that applied without
	// breaking a probe, whether or not some object of it failed (a
	// conflict on one link must not switch safe apply off for good).
	if d.hash != d.badHash {
		good := des
		d.lastGood = &good
		if d.status.LastRollback != nil {
			d.setCondition(api.CondSafeApply, api.True, "Applied", "the running config applied with every probe passing")
		}
	}
	return res
}

// checkARP resolves every checks.arpReachable address and reports the
// ARPReachable condition (the seeds' outage: a node that could not ARP a
// VIP it announced itself).
func (d *Daemon) checkARP(ctx context.Context) {
	probes := ARPProbes(d.host, d.cfg)
	if len(probes) == 0 {
		return
	}
	failed := runProbes(ctx, probes)
	if len(failed) == 0 {
		d.setCondition(api.CondARPReachable, api.True, "Resolved", fmt.Sprintf("%d address(es) answer ARP", len(probes)))
		d.refreshHealth()
		return
	}
	var msgs []string
	for _, p := range probes {
		if err := failed[p.Name]; err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	d.setCondition(api.CondARPReachable, api.False, "Unresolved", strings.Join(msgs, "; "))
	d.refreshHealth()
}

// effective is des as the daemon converges it, and as its plan shows it:
// each PIA device as its provider has it, the DNS guard of the redirected
// sources, and the rules that keep the tunnels' own addresses in them.
func (d *Daemon) effective(des netcfg.Desired) netcfg.Desired {
	des = d.withPIA(des)
	des.Nft = guardDNS(d.cfg, des.Nft)
	des = piaSourceRules(d.cfg, des)
	if d.role != nil {
		// The role's addresses and devices, as this node's part in the
		// role has them.
		des = d.role.Gate(des)
	}
	return des
}
