// Package agent runs nodeagent's convergence: the one-shot commands
// (validate, plan, apply --once, teardown) here, and the long-running loop,
// local API and health reporting as they are built.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/nodeagent/nodeagent/agent/filecheck"
	"github.com/nodeagent/nodeagent/agent/saveguard"
	"github.com/nodeagent/nodeagent/agent/waiting"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"golang.org/x/sys/unix"
)

// InvalidError is a config that failed validation. Its text is the list
// of file:line: field: reason lines and nothing else.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Options are what the one-shot commands are run with.
type Options struct {
	// Config is the path of nodeagent.yaml.
	Config string
	// TablesFile is the rt_tables.d entry naming the routing tables;
	// "" leaves names alone. The demo lab points it away from /etc.
	TablesFile string
	// Register caches parsed peer files across loads (nil: none); the
	// daemon keeps one, since it re-reads the register on every resync.
	Register *register.Cache
	// StateDir is where the daemon keeps state (default
	// /var/lib/nodeagent): the PIA providers' registrations, keys and
	// cached server lists, under pia/.
	StateDir string
	// Force lets teardown delete a link that links of other network
	// namespaces (pods) sit on, which the kernel deletes with it.
	Force bool
	// PortDir is where a daemon publishes its forwarded ports (beside its
	// socket: /run/nodeagent/pia by default); teardown removes them.
	PortDir string
}

// Load reads and validates the config at o.Config and derives the desired
// state.
func Load(o Options) (*config.Config, netcfg.Desired, error) {
	c, d, _, err := load(o, nil)
	return c, d, err
}

// load is Load that also returns the config file's bytes, read once, so
// that the daemon's config hash describes exactly what was loaded. With
// st, new kernel WireGuard devices are filled as their registers are read
// (netcfg.FromConfigStaged).
func load(o Options, st *wg.Stager) (*config.Config, netcfg.Desired, []byte, error) {
	path := o.Config
	c, raw, err := config.ReadWith(path, config.Options{PIARegion: cachedRegion(o.StateDir)})
	var list config.ErrorList
	invalid := errors.As(err, &list)
	if (err == nil || invalid) && saveguard.Empty(raw) {
		// What a truncating or failed write leaves is never a config.
		return nil, netcfg.Desired{}, nil, &InvalidError{saveguard.EmptyError(path)}
	}
	if err != nil {
		if invalid {
			return nil, netcfg.Desired{}, nil, &InvalidError{err}
		}
		return nil, netcfg.Desired{}, nil, err
	}
	d, err := netcfg.FromConfigStaged(c, o.TablesFile, o.Register, st)
	if err != nil {
		return nil, netcfg.Desired{}, nil, &InvalidError{fmt.Errorf("%s: %w", path, err)}
	}
	return c, d, raw, nil
}

// piaDevices names the config's PIA devices. apply --once refuses them:
// a PIA tunnel is kept registered by the daemon's provider, which a
// one-shot command is not.
func piaDevices(c *config.Config) []string {
	var out []string
	for _, w := range c.WireGuard {
		if w.PIA != nil {
			out = append(out, w.Name)
		}
	}
	return out
}

func usesRouting(d netcfg.Desired) bool {
	return len(d.Route.Routes) > 0 || len(d.Route.Rules) > 0
}

// Validate checks the config at path, and reads every file it names as
// the daemon will (package filecheck), and writes a one-line verdict to w.
// A file the daemon would fail on makes the config invalid, at the line
// of the field naming it.
func Validate(w io.Writer, o Options) error {
	path := o.Config
	c, _, err := Load(o)
	if err != nil {
		return err
	}
	errs, warns := filecheck.Check(c, filecheck.Options{StateDir: o.StateDir})
	if len(errs) == 0 {
		fmt.Fprintf(w, "%s: valid\n", path)
	}
	for _, warn := range Warnings(c) {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	for _, warn := range warns {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	if len(errs) > 0 {
		return &InvalidError{errs}
	}
	return nil
}

// Plan writes what a sync would change, one line per object, without
// writing anything. It needs no privileges.
func Plan(ctx context.Context, w io.Writer, o Options) error {
	c, d, err := Load(o)
	if err != nil {
		return err
	}
	h, err := host.Current()
	if err != nil {
		return err
	}
	defer h.Close()
	cv := &netcfg.Converger{Host: h, StateDir: cmp.Or(o.StateDir, pia.DefaultStateDir)}
	defer cv.Close()
	pd := planPIA(c, d, o)
	pd.Nft = guardDNS(c, pd.Nft)
	pd = piaSourceRules(c, pd)
	p, err := cv.Plan(ctx, pd)
	// Without CAP_NET_ADMIN the kernel refuses to show some state (the
	// nftables ruleset): say which, and plan everything else.
	var unreadable []error
	_, _, failed := netcfg.Split(err)
	for _, e := range failed {
		if !errors.Is(e, unix.EPERM) {
			return err
		}
		unreadable = append(unreadable, e)
	}
	for _, e := range unreadable {
		fmt.Fprintf(w, "! %v (not readable without root; that part is not planned)\n", e)
	}
	// The files the config names, at the lines naming them.
	errs, warns := filecheck.Check(c, filecheck.Options{StateDir: o.StateDir})
	for _, e := range errs {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	warnings := Warnings(c)
	for _, warn := range warns {
		warnings = append(warnings, warn.Error())
	}
	warnings = append(warnings, networkdHazards(h, d)...)
	for _, warn := range warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	if p.Empty() {
		fmt.Fprintln(w, "no changes")
		return nil
	}
	_, err = io.WriteString(w, p.String())
	return err
}

// ApplyOnce converges the node to the config once. It writes the changes it
// made to w and fails naming every object that failed.
func ApplyOnce(ctx context.Context, w io.Writer, log *slog.Logger, o Options) error {
	path := o.Config
	c, d, err := Load(o)
	if err != nil {
		return err
	}
	if devs := piaDevices(c); len(devs) > 0 {
		return fmt.Errorf("%s: wireguard %s: a PIA tunnel is registered and kept healthy by the daemon (nodeagent run), which apply --once is not; nothing applied", path, strings.Join(devs, ", "))
	}
	h, err := host.Current()
	if err != nil {
		return err
	}
	defer h.Close()
	for _, warn := range networkdHazards(h, d) {
		log.Warn(warn)
	}
	cv := &netcfg.Converger{Host: h, Log: log, StateDir: cmp.Or(o.StateDir, pia.DefaultStateDir)}
	defer cv.Close()
	// Plan once; apply exactly that plan. A device that only the
	// userspace implementation could run needs a long-running process to
	// host it: refuse before changing anything rather than converge the
	// rest without it.
	p, _ := cv.Plan(ctx, d)
	if len(p.WG.NeedHost()) > 0 {
		return fmt.Errorf("%s: wireguard %s: the kernel has no WireGuard, and the userspace implementation lives in nodeagent's own process, which apply --once is not; nothing applied", path, strings.Join(p.WG.NeedHost(), ", "))
	}
	res := cv.Apply(ctx, p)
	io.WriteString(w, res.Applied.String())
	if f := res.Forwarding.String(); f != "" {
		log.Error(f)
	}
	// The write counts make "a converged node is left alone" checkable
	// from outside: a no-op apply logs zeros.
	log.Info("sync done", "netlinkWrites", h.Writes(), "wireguardWrites", cv.WG().ConfigWrites())
	var failed []error
	for _, e := range res.Report {
		switch {
		case e.Pending():
			log.Warn("waiting", "object", e.Err.Error())
		case e.Skipped():
			// A skipped peer (a register file that does not parse) is
			// reported, not a failure: its device and the other peers
			// are converged.
			log.Warn("skipped", "object", e.Err.Error())
		case e.Failed():
			failed = append(failed, e.Err)
		}
	}
	// What waits for a link the config does not create has no later
	// sync here to wait for: the node is not converged.
	for _, wt := range waiting.Find(res.Report, createsLink(d), func() []string { return linkNames(h) }) {
		failed = append(failed, fmt.Errorf("%s: %s", path, wt))
	}
	if len(failed) > 0 {
		return errors.Join(failed...)
	}
	if res.Applied.Empty() {
		fmt.Fprintln(w, "no changes")
	}
	return nil
}

// Teardown removes everything nodeagent owns on this node, whatever the
// config says, and nothing else.
func Teardown(ctx context.Context, w io.Writer, log *slog.Logger, o Options) error {
	h, err := host.Current()
	if err != nil {
		return err
	}
	defer h.Close()
	cv := &netcfg.Converger{Host: h, Log: log}
	defer cv.Close()
	guard := func(p netcfg.Plans) error {
		if o.Force {
			return nil
		}
		return keepPods(ctx, h, p, log)
	}
	p, err := cv.Teardown(ctx, o.TablesFile, guard)
	io.WriteString(w, p.String())
	if err == nil {
		// And a start-up's staging device that a daemon which died left
		// behind: it holds the device's key and peers.
		wg.NewStager(h, log).Wait(0)
	}
	// The PIA registrations ran on devices that are gone now; a later
	// run registers afresh. (Keys and the cached server list stay.)
	if ferr := pia.StoreAt(o.StateDir).ForgetAll(); ferr != nil {
		log.Warn("forgetting the PIA registrations", "err", ferr)
	}
	removePorts(o, log)
	return err
}
