package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/gateway"
	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/agent/saveguard"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// load reads and validates the config and derives the desired state,
// replacing the running one only when all of it is valid. The reading
// (config, registers, key files) runs off the loop with a deadline: a file
// on a wedged filesystem must not stop convergence of what is loaded.
//
// A resync may keep the desired state without reading more than the
// config itself (quietBase says when).
//
// A change that takes away wholesale (saveguard.Risks: every object, or
// every one of a kind, or a kill switch) is applied only when an operator
// asked for the reload (nodeagentctl reload, SIGHUP), and then with a WARN
// line; a file event or a resync that finds one returns a *HeldError and
// changes nothing.
func (d *Daemon) load(why trigger) error {
	if why == trigResync && d.files != nil && d.files.whole.Writing() {
		// A writer has the file open: it is read once closed (the
		// watch kicks then), never half-way.
		return errWriting
	}
	r, err := d.read(why == trigResync)
	if err != nil {
		return err
	}
	if !r.quiet && d.cfg != nil {
		if risks := saveguard.Risks(d.cfg, r.cfg); len(risks) > 0 {
			asked := why == trigSignal || why == trigAPI
			if !asked && !d.reloadCovers() {
				return &HeldError{Sum: sha256.Sum256(r.raw), Risks: risks}
			}
			attrs := []any{"file", d.o.Config, "trigger", why.String(), "change", saveguard.Summary(risks)}
			if !asked {
				attrs = append(attrs, "reload", fmt.Sprintf("%s before the save", time.Duration(d.savedAt.Load()-d.reloadAt.UnixNano()).Round(time.Millisecond)))
			}
			d.log.Warn("applying a config change that takes away wholesale, as an operator's reload asked", attrs...)
		}
	}
	d.held = [32]byte{}
	if d.onLoad != nil {
		defer func() { d.onLoad(r.quiet) }()
	}
	if r.quiet {
		d.quietRuns++
		return nil
	}
	d.quietRuns = 0
	d.loadGen, d.rawSum, d.dirIDs = r.gen, sha256.Sum256(r.raw), r.dirs
	d.cfg, d.desired, d.hash = r.cfg, r.des, hex.EncodeToString(d.rawSum[:8])
	d.clients.SetConfig(r.cfg)
	d.setWarnings(r.cfg)
	d.want.Store(interestOf(r.des, d.waitingFor))
	d.setPIA(r.pia)
	return nil
}

// reloadFollow is how long after an operator's reload a save still counts
// as the one the reload was for. A reload read by the loop a moment
// before the file changed (the API's reload is served at once, not
// debounced; a script that reloads, then writes) read the file before the
// save: the save's own event must not then be held as one nobody asked
// for. A SIGHUP and a save in one debounced burst need no window: the
// burst is the reload's (merge).
const reloadFollow = time.Second

// reloadCovers reports whether the config's last change came within
// reloadFollow after an operator's reload, so the reload asked for it.
func (d *Daemon) reloadCovers() bool {
	if d.reloadAt.IsZero() {
		return false
	}
	after := time.Duration(d.savedAt.Load() - d.reloadAt.UnixNano())
	return after >= 0 && after <= reloadFollow
}

// loaded is what one read of the config produced.
type loaded struct {
	cfg *config.Config
	des netcfg.Desired
	raw []byte
	pia map[string]piaSetup
	err error
	// gen is the file watch's generation before the read began, and dirs
	// what the directories it read from were just after.
	gen  uint64
	dirs map[string]dirID
	// quiet: the config read the same as before and nothing else was
	// read; cfg and des are unset.
	quiet bool
}

// fullEvery: every fullEvery-th resync in a row reads everything again
// (the nine before it may keep the desired state), for changes a
// directory watch cannot see: a file written through a hard link from
// elsewhere, or a register file that is a link into a subdirectory of its
// peersDir and changed there, or a network filesystem written from
// another host.
const fullEvery = 10

// quietBase reports whether a resync may keep the desired state as the
// last full read left it, after reading just the config to see it is the
// same: the last sync did not fail, no event or watch error came from the
// watched directories since before that read, and they hold every
// directory it read from (peer registers and key files; the config, which
// may be a link to elsewhere, is compared). The read checks those
// directories are still the ones it read (dirIDs). With thousands of
// register files, this is most of what the idle daemon would otherwise
// spend. PIA devices are read every time (their state directory moves
// with each registration).
func (d *Daemon) quietBase() bool {
	if d.files == nil || d.cfg == nil || d.failures > 0 || d.quietRuns >= fullEvery-1 || d.files.gen.Load() != d.loadGen {
		return false
	}
	dirs, ok := inputDirs(d.cfg, d.desired)
	return ok && d.files.covers(dirs)
}

// inputDirs are the directories a full read of c took files from, besides
// the config's own: the peer registers and those of the key files. ok is
// false when something calls for a full read whatever the watch says: a
// PIA device, a register that could not be read, a refused entry (perhaps
// for a key file it names elsewhere), a device whose key is unreadable.
func inputDirs(c *config.Config, des netcfg.Desired) (dirs []string, ok bool) {
	for _, w := range c.WireGuard {
		if w.PIA != nil {
			return nil, false
		}
		if w.PeersDir != "" {
			dirs = append(dirs, filepath.Clean(w.PeersDir))
		}
	}
	for _, dev := range des.WG.Devices {
		if dev.KeepPeers || len(dev.Skipped) > 0 || dev.Broken != "" {
			return nil, false
		}
		for _, f := range dev.KeyFiles {
			dirs = append(dirs, filepath.Dir(filepath.Clean(f)))
		}
	}
	return dirs, true
}

// dirID is what a directory's path leads to: another filesystem mounted
// over it, or a link on its path pointed elsewhere, moves it without an
// event in the directory itself.
type dirID struct{ dev, ino uint64 }

// dirIDs stats each of dirs (following links, as the reads do); one that
// cannot be stat'ed is left out, and so differs from one that can.
func dirIDs(dirs []string) map[string]dirID {
	out := make(map[string]dirID, len(dirs))
	for _, d := range dirs {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil {
			out[d] = dirID{st.Dev, st.Ino}
		}
	}
	return out
}

// loadDeadline bounds how long the loop waits for the config, its
// registers and key files to be read (local files take milliseconds).
const loadDeadline = 10 * time.Second

// read reads the config in a goroutine and waits for it up to
// loadDeadline. A read that overruns is not abandoned: the next read
// waits for it rather than start another, and whatever it returns then is
// followed by a fresh read, since the files may have changed meanwhile.
func (d *Daemon) read(resync bool) (loaded, error) {
	stale := d.reading != nil
	if !stale {
		ch := make(chan loaded, 1)
		o, h, timers := d.o.Options, d.host, d.o.PIATimers
		var gen uint64
		if d.files != nil {
			gen = d.files.gen.Load()
		}
		quiet, sum, ids := resync && d.quietBase(), d.rawSum, d.dirIDs
		var st *wg.Stager
		if d.staging {
			st = d.stager
		}
		go func() {
			if quiet {
				if raw, err := config.ReadRaw(o.Config); err == nil && sha256.Sum256(raw) == sum && maps.Equal(dirIDs(slices.Collect(maps.Keys(ids))), ids) {
					ch <- loaded{quiet: true}
					return
				}
			}
			c, des, raw, err := load(o, st)
			var setups map[string]piaSetup
			var now map[string]dirID
			if err == nil {
				setups = readPIA(c, o, h, timers)
				if dirs, ok := inputDirs(c, des); ok {
					now = dirIDs(dirs)
				}
			}
			ch <- loaded{cfg: c, des: des, raw: raw, pia: setups, err: err, gen: gen, dirs: now}
		}()
		d.reading = ch
	}
	select {
	case r := <-d.reading:
		d.reading = nil
		if stale {
			d.kickNow(trigConfig)
		}
		return r, r.err
	case <-time.After(loadDeadline):
		return loaded{}, fmt.Errorf("reading %s and its peer registers and key files did not finish within %s (a file on a filesystem that does not answer?); the running config stays", d.o.Config, loadDeadline)
	}
}

// interestOf is what the event filters look for with des converging:
// the links it makes or puts on a parent, its WireGuard devices, and the
// links objects wait for (waiting), which the config does not create.
func interestOf(des netcfg.Desired, waiting []string) *interest {
	in := &interest{names: map[string]bool{}}
	for _, n := range waiting {
		in.names[n] = true
	}
	for _, l := range des.Link.Links {
		in.names[l.Name] = true
		in.names[l.Parent] = true
	}
	for _, dev := range des.WG.Devices {
		in.names[dev.Name] = true
	}
	// The devices routes name: one the config does not create may appear
	// late or be deleted by its program, and the kernel flushes the
	// routes on it without a route event.
	for _, r := range des.Route.Routes {
		if r.Dev != "" {
			in.names[r.Dev] = true
		}
	}
	return in
}

// reload re-reads the config. An invalid one is rejected whole: nothing
// changes, the running config stays, and status says which file and line.
func (d *Daemon) reload(why trigger) {
	if why != trigResync {
		// systemd wants READY=1 again once a reload is done.
		d.notify.Reloading()
		defer func() {
			if d.ready {
				d.notify.Ready(d.summary())
			} else {
				d.notify.Status(d.summary())
			}
		}()
	}
	old := d.hash
	err := d.load(why)
	if why != trigResync {
		// An operator's reload retries what waits for its backoff (the
		// credentials may be fixed now).
		d.kickPIA()
	}
	var invalid *InvalidError
	var held *HeldError
	switch {
	case errors.Is(err, errWriting):
	case errors.As(err, &held):
		msg := fmt.Sprintf("%s changed, and the change is held (running config %s): %s; nodeagentctl reload or SIGHUP applies it", d.o.Config, old, saveguard.Summary(held.Risks))
		if held.Sum != d.held {
			d.held = held.Sum
			d.log.Warn("config change held; the running config stays until an operator's reload applies it", "file", d.o.Config, "change", saveguard.Summary(held.Risks), "apply", "nodeagentctl reload, or systemctl reload nodeagent")
		}
		d.setCondition(api.CondConfigLoaded, api.False, "Held", msg)
		d.refreshHealth()
	case errors.As(err, &invalid):
		lines := capLines(errorLines(invalid.Err), maxRejectedLines, "nodeagent validate -c "+d.o.Config+" lists the rest")
		d.log.Error("config rejected; the running config stays", "file", d.o.Config, "errors", strings.Join(lines, "; "))
		d.mu.Lock()
		d.status.LastRejected = &api.Rejected{Time: time.Now().UTC(), File: d.o.Config, Errors: lines}
		d.mu.Unlock()
		d.setCondition(api.CondConfigLoaded, api.False, "Rejected", fmt.Sprintf("%s rejected, running config %s: %s", d.o.Config, old, lines[0]))
		d.refreshHealth()
	case err != nil:
		d.log.Error("config unreadable; the running config stays", "err", err)
		d.setCondition(api.CondConfigLoaded, api.False, "Unreadable", err.Error())
		d.refreshHealth()
	default:
		if d.hash != old {
			d.log.Info("config loaded", "hash", d.hash, "trigger", why.String())
		}
		d.setCondition(api.CondConfigLoaded, api.True, "Loaded", "config "+d.hash)
		d.refreshHealth()
		if kc, err := kube.FromConfig(d.cfg); err == nil && d.labeler != nil {
			d.labeler.SetConfig(kc)
		}
		d.setRole()
		if d.files != nil {
			d.files.set(d.peerDirs(), d.keyFiles(), d.log)
		}
	}
}

// setRole starts, replaces or stops the gateway role as the config says.
// A changed gateway section restarts the role's election (a holder
// releases the Lease, and the role may move); an unchanged one keeps it.
func (d *Daemon) setRole() {
	if d.runCtx == nil {
		return // before Run: it starts the role
	}
	key := ""
	if g := d.cfg.Gateway; g != nil {
		key = fmt.Sprintf("%+v|%s|%s", *g, d.cfg.Node.Name, d.cfg.Kubernetes.Kubeconfig)
	}
	if key == d.roleKey && (d.role != nil || key == "") {
		return
	}
	if d.role != nil {
		d.roleStop()
		d.metrics.Registry.Unregister(d.role.Collector())
		d.role, d.roleStop = nil, nil
	}
	d.roleKey = key
	if key == "" {
		d.removeCondition(api.CondGatewayRole)
		d.mu.Lock()
		d.status.Gateway = nil
		d.mu.Unlock()
		return
	}
	cfg, err := gateway.FromConfig(d.cfg, d.host, d.log, func() { d.kickNow(trigProvider) })
	var r *gateway.Role
	if err == nil {
		r, err = gateway.New(cfg)
	}
	if err != nil {
		d.roleKey = "" // tried again at the next reload
		d.log.Error("gateway role cannot start", "role", d.cfg.Gateway.Name, "err", err)
		d.setCondition(api.CondGatewayRole, api.False, "CannotStart", err.Error())
		d.refreshHealth()
		return
	}
	// Not Run's context: a stop hands the role over before its
	// goroutines end (the loop calls HandOver, then roleStop).
	ctx, cancel := context.WithCancel(context.Background())
	d.role, d.roleStop = r, cancel
	d.metrics.Registry.MustRegister(r.Collector())
	r.Start(ctx)
}

// errWriting: the config file is being written; a resync leaves it, and
// the verdict on the last read, as they are.
var errWriting = errors.New("the config file is being written")

// HeldError is a config change a file event or a resync found and did not
// apply: it takes away wholesale (Risks), which only an operator's reload
// does. Sum is the held file's, so that it is logged once.
type HeldError struct {
	Sum   [32]byte
	Risks []string
}

func (e *HeldError) Error() string {
	return "config change held until an operator's reload: " + saveguard.Summary(e.Risks)
}

// errorLines lists a rejected config's problems, one per line: each
// config.FieldError of its ErrorLists, and any other error whole.
func errorLines(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case nil:
		case config.ErrorList:
			for _, fe := range x.Sorted() {
				out = append(out, fe.Error())
			}
		case interface{ Unwrap() []error }:
			for _, y := range x.Unwrap() {
				walk(y)
			}
		default:
			out = append(out, e.Error())
		}
	}
	walk(err)
	if len(out) == 0 {
		out = []string{"rejected"}
	}
	return out
}

// maxRejectedLines bounds the errors a rejected reload keeps in status and
// the log: the first ones say what to fix.
const maxRejectedLines = 20

// capLines keeps the first n lines and a last one counting the rest.
func capLines(lines []string, n int, rest string) []string {
	if len(lines) <= n {
		return lines
	}
	return append(lines[:n:n], fmt.Sprintf("and %d more; %s", len(lines)-n, rest))
}
