package agent

import (
	"context"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/neighbours"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
)

// neighbourHazards is what would undo d's work on this node, for plan and
// apply --once (package neighbours), one line each, with the links as h
// has them.
func neighbourHazards(h *host.Host, d netcfg.Desired) []string {
	obs, _ := link.Observe(context.Background(), h.Snapshot(), d.Link)
	var out []string
	for _, hz := range neighbours.Once(context.Background(), hazard.Paths{}, d, obs) {
		out = append(out, hz.String())
	}
	return out
}

// hazardsEvery bounds how often the daemon looks for hazards between
// config loads: it reads the neighbours' configuration.
const hazardsEvery = 30 * time.Second

// repairLook bounds how often a drift repair makes the daemon look for
// hazards again.
const repairLook = time.Second

// checkHazards sets the Coexistence condition from the hazards found on
// this node, at most every hazardsEvery (or resync period), at every config
// load and whenever a neighbour's files or state changed (d.neighbours),
// with the links as the sync observed them.
func (d *Daemon) checkHazards(res netcfg.Result) {
	d.hazardObs = res.Post.Link.Observed
	every := min(hazardsEvery, d.o.Resync)
	if d.hash == d.hazardHash && time.Since(d.hazardAt) < every {
		return
	}
	d.evalHazards()
}

// evalHazards looks for hazards now (package neighbours logs a new set).
func (d *Daemon) evalHazards() {
	d.hazardHash, d.hazardAt = d.hash, time.Now()
	hs := d.nb.Eval(neighbours.Links(d.o.Hazards, d.desired, d.hazardObs), neighbours.Routing(d.desired))
	if len(hs) == 0 {
		d.setCondition(api.CondCoexistence, api.True, "NoHazards", "")
		return
	}
	lines := make([]string, len(hs))
	for i, hz := range hs {
		lines[i] = hz.String()
	}
	d.setCondition(api.CondCoexistence, api.False, "HazardsFound", strings.Join(lines, "; "))
}

// neighbourChanged tells the loop that a neighbour's files or state
// changed; it never blocks.
func (d *Daemon) neighbourChanged() {
	select {
	case d.neighbours <- struct{}{}:
	default:
	}
}

// checkFights counts the repairs of a drift sync per object (package
// fight), backs off an object repaired too often, lets go of one whose
// repair held, and sets the Conflict condition from what is backed off: the
// object, the rate and the program most likely doing it (absent until a
// first fight). A new config starts afresh.
func (d *Daemon) checkFights(drift bool, res netcfg.Result) {
	now := time.Now()
	switch {
	case d.hash != d.syncedHash:
		d.fights.Reset()
	case drift:
		for _, f := range d.fights.Record(res.Report, res.Applied.Guarded(), now) {
			if time.Since(d.hazardAt) >= repairLook {
				d.evalHazards()
			}
			d.log.Warn("backing off: another program keeps changing nodeagent's object back", "object", f.Object, "rate", f.Rate,
				"suspect", d.nb.Suspect(f.Kind, f.Object, f.Text), "now", "repaired once per resync until a repair holds")
		}
	}
	for _, f := range d.fights.Expire(now) {
		d.log.Info("no longer backing off: nodeagent's repair held", "object", f.Object, "repairs", f.Repairs)
	}
	fs := d.fights.Fights()
	if len(fs) == 0 {
		// Absent until a first fight; True once it is over.
		if d.condition(api.CondConflict) != nil {
			d.setCondition(api.CondConflict, api.True, "NoFight", "")
		}
		return
	}
	msgs := make([]string, len(fs))
	for i, f := range fs {
		msgs[i] = d.fights.Describe(f, d.nb.Suspect(f.Kind, f.Object, f.Text))
	}
	d.setCondition(api.CondConflict, api.False, "BackedOff", strings.Join(msgs, "; "))
}
