package release

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/portfwd"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/dependents"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
)

// Config is what Run is given.
type Config struct {
	// Desired is the config's desired state: its adopt: true marks say
	// what to hand back.
	Desired netcfg.Desired
	// Etc stands for /etc, where the old owners' files are read.
	Etc string
	// TablesFile is nodeagent's rt_tables.d entry, removed with the rest.
	TablesFile string
	// StateDir is the daemon's state directory: the PIA registrations
	// and the record of kept peers there are forgotten.
	StateDir string
	// PortDir is where the daemon published its forwarded ports (beside
	// its socket); their files are removed.
	PortDir string
	Options
	// Force deletes links that pods' links sit on.
	Force bool
	// DryRun prints the plan, the steps and the notes, and changes
	// nothing.
	DryRun bool
	Log    *slog.Logger
	// Host is the namespace to work on; nil: this process's.
	Host *host.Host
}

// Run releases the node: it plans (Make), refuses while pods' links sit
// on a link it would delete (unless Force), prints the plan, carries it
// out in teardown's order, forgets nodeagent's state of the devices, and
// prints the steps that start the old setup again and the notes. With
// DryRun it prints and stops.
func Run(ctx context.Context, w io.Writer, c Config) error {
	h := c.Host
	if h == nil {
		var err error
		if h, err = host.Current(); err != nil {
			return err
		}
		defer h.Close()
	}
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cv := &netcfg.Converger{Host: h, Log: log}
	defer cv.Close()
	tp, err := cv.TeardownPlan(ctx, c.TablesFile)
	if err != nil {
		// Something could not be read: handing back or removing the rest
		// blind could take the kill switch away before what it protects.
		return fmt.Errorf("release stopped before changing anything: %w", err)
	}
	var links, devs []string
	for _, l := range c.Desired.Link.Links {
		if l.Adopt {
			links = append(links, l.Name)
		}
	}
	for _, d := range c.Desired.WG.Devices {
		if d.Adopt {
			devs = append(devs, d.Name)
		}
	}
	etc := c.Etc
	if etc == "" {
		etc = "/etc"
	}
	p := Make(tp, c.Desired, ReadOwners(etc, links, devs), c.Options)
	if !c.Force {
		if err := keepPods(ctx, h, p, c.InPlace, log); err != nil {
			return fmt.Errorf("release stopped before changing anything: %w", err)
		}
	}
	if p.Plans.Empty() {
		fmt.Fprintln(w, "nothing of nodeagent's on this node")
	} else {
		io.WriteString(w, p.Plans.String())
	}
	if c.DryRun {
		fmt.Fprintln(w, "dry run: nothing changed")
		printAfter(w, p)
		return nil
	}
	if err := cv.ExecuteTeardown(ctx, p.Plans); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	// A start-up's staging device that a daemon which died left behind:
	// it holds a device's key and peers.
	wg.NewStager(h, log).Wait(0)
	// The registrations ran on devices nodeagent no longer has; the
	// kept peers were kept on devices that are not its own now.
	if err := pia.StoreAt(c.StateDir).ForgetAll(); err != nil {
		log.Warn("forgetting the PIA registrations", "err", err)
	}
	if err := wg.ForgetKept(c.StateDir); err != nil {
		log.Warn("forgetting the peers kept from adoptions", "err", err)
	}
	dir := c.PortDir
	if dir == "" {
		dir = filepath.Join(filepath.Dir(api.DefaultSocket), "pia")
	}
	if err := portfwd.RemoveFiles(dir); err != nil {
		log.Warn("removing the forwarded ports' files", "dir", dir, "err", err)
	}
	printAfter(w, p)
	return nil
}

// printAfter prints the notes and the steps that start the old setup
// again.
func printAfter(w io.Writer, p Plan) {
	for _, n := range p.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(p.Steps) == 0 {
		return
	}
	fmt.Fprintln(w, "then, to start the old setup again, as root:")
	for i, s := range p.Steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
}

// keepPods refuses a release that would delete a link which links of
// other network namespaces (pods) sit on, as teardown refuses, naming
// them and the ways out.
func keepPods(ctx context.Context, h *host.Host, p Plan, inPlace bool, log *slog.Logger) error {
	names := p.Link.Deletes()
	deps, err := dependents.Find(ctx, h.NS(), slices.Collect(maps.Keys(names)))
	if err != nil {
		log.Warn("not every network namespace could be searched for links on nodeagent's", "err", err)
	}
	return podsRefusal(deps, names, p.Deleted, inPlace)
}

// podsRefusal is keepPods' error for the pods' links deps on the links
// names (by ifindex); deleted are the old setup's links release deletes.
func podsRefusal(deps []dependents.Link, names map[int]string, deleted []string, inPlace bool) error {
	fix := "remove those pods first (or their attachments, with CNI DEL)"
	for _, d := range deps {
		if !inPlace && slices.Contains(deleted, names[d.Parent]) {
			// A link of the old setup's, deleted for its unit to make
			// again: it can be handed back as it is instead.
			fix += ", or run nodeagent release --in-place (what the old setup makes itself is handed back as it is, and its units make it at the next boot)"
			break
		}
	}
	fix += ", or run nodeagent release --force (the pods lose those links)"
	return dependents.Refusal(deps, names, "release", fix)
}
