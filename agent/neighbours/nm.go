package neighbours

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/nmbus"
)

// The NetworkManager watch's settings; tests point it at a bus of their
// own and shorten its waits.
var (
	// nmBusAddress is the bus; "" is the system bus.
	nmBusAddress = ""
	// nmRetry is how long the watch waits to connect again after the bus
	// is missing or lost, and how often it reads NetworkManager's devices
	// without being told they changed.
	nmRetry = 30 * time.Second
	// nmSettle coalesces a burst of NetworkManager's signals into one
	// read.
	nmSettle = 300 * time.Millisecond
)

// nmReadTimeout bounds one read of every link's device.
const nmReadTimeout = 10 * time.Second

// nmWatch follows NetworkManager over D-Bus for the Coexistence condition.
// Its goroutine asks NetworkManager to leave each of nodeagent's links
// unmanaged (once per link per NetworkManager instance) and keeps a view
// of the links it still holds as its own: those it would not let go, or
// took back.
type nmWatch struct {
	log     *slog.Logger
	changed func()
	poke    chan struct{}
	// addr, retry and settle are nmBusAddress, nmRetry and nmSettle at
	// the start.
	addr          string
	retry, settle time.Duration
	// done is closed when the goroutine has returned.
	done chan struct{}

	mu sync.Mutex
	// links are nodeagent's link names, as hazards was last given them.
	links []string
	// held is what the watch last saw: for each of nodeagent's links that
	// NetworkManager holds as its own, what it does.
	held map[string]string
}

// startNetworkManager starts following NetworkManager; changed is called
// (it must not block) when what it holds about nodeagent's links changes.
func startNetworkManager(ctx context.Context, log *slog.Logger, changed func()) *nmWatch {
	w := &nmWatch{log: log, changed: changed, poke: make(chan struct{}, 1),
		addr: nmBusAddress, retry: nmRetry, settle: nmSettle, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.run(ctx)
	}()
	return w
}

// hazards says which of links NetworkManager holds as its own, from what
// the watch last saw; it never blocks. links are nodeagent's link names.
func (w *nmWatch) hazards(links []string) []hazard.Hazard {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	if !slices.Equal(links, w.links) {
		w.links = slices.Clone(links)
		select {
		case w.poke <- struct{}{}:
		default:
		}
	}
	var out []hazard.Hazard
	for _, name := range links {
		what, ok := w.held[name]
		if !ok {
			continue
		}
		out = append(out, hazard.Hazard{
			Source:  "NetworkManager",
			Manager: "NetworkManager",
			Link:    name,
			What:    what,
			Fix: "unmanaged-devices=interface-name:" + name + " under [keyfile] in /etc/NetworkManager/conf.d/nodeagent.conf " +
				"(example in /usr/share/doc/nodeagent/examples/NetworkManager/conf.d/), then systemctl reload NetworkManager",
			Kinds: []string{"address", "route"},
		})
	}
	w.mu.Unlock()
	return out
}

// currentLinks are the link names hazards was last given.
func (w *nmWatch) currentLinks() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.links
}

// setHeld replaces the view, and tells the daemon when it changed.
func (w *nmWatch) setHeld(held map[string]string) {
	w.mu.Lock()
	same := maps.Equal(held, w.held)
	w.held = held
	w.mu.Unlock()
	if !same {
		w.changed()
	}
}

// run keeps a connection to the bus, quietly trying again every nmRetry
// while there is none.
func (w *nmWatch) run(ctx context.Context) {
	for {
		err := w.session(ctx)
		w.setHeld(nil)
		if ctx.Err() != nil {
			return
		}
		w.log.Debug("NetworkManager's bus", "err", err, "retry", w.retry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.retry):
		}
	}
}

// nmInstance is what the watch did under one NetworkManager (one owner
// of its bus name): the devices it asked to leave nodeagent's links
// alone, and when, the links it logged, and the refusals.
type nmInstance struct {
	owner   string
	asked   map[dbus.ObjectPath]time.Time
	logged  map[string]bool
	refused map[string]string
}

// session is one connection to the bus: it reads NetworkManager's devices
// for nodeagent's links at the start, on its signals, when the links
// change and every nmRetry, until the connection is lost.
func (w *nmWatch) session(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, nmbus.CallTimeout)
	c, err := nmbus.Dial(dctx, w.addr)
	if err == nil {
		err = c.Subscribe(dctx)
		if err != nil {
			c.Close()
		}
	}
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	tick := time.NewTicker(w.retry)
	defer tick.Stop()
	var inst nmInstance
	for {
		if err := w.refresh(ctx, c, &inst); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.Done():
			return errors.New("connection to the bus lost")
		case <-tick.C:
		case <-w.poke:
		case <-c.Events():
			// A burst of signals (a restart, an activation) is read once.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(w.settle):
			}
			select {
			case <-c.Events():
			default:
			}
		}
	}
}

// refresh reads what NetworkManager holds of nodeagent's links, asks it to
// leave each it holds alone (once per device object: a restarted
// NetworkManager that holds a link, or a re-created link, is asked again;
// a refusal is asked again after nmRetry), and sets the view to those it
// still holds. A link it took back (held after it was seen to let it go,
// up and unmanaged, under this instance) is reported, not fought over:
// an operator's nmcli device set ... managed yes. An error is the bus's, not
// NetworkManager's.
func (w *nmWatch) refresh(ctx context.Context, c *nmbus.Conn, inst *nmInstance) error {
	ctx, cancel := context.WithTimeout(ctx, nmReadTimeout)
	defer cancel()
	owner, err := c.Owner(ctx)
	if err != nil {
		return err
	}
	if owner != inst.owner {
		if owner != "" {
			w.log.Debug("NetworkManager is running", "owner", owner)
		}
		*inst = nmInstance{owner: owner, asked: map[dbus.ObjectPath]time.Time{}, logged: map[string]bool{}, refused: map[string]string{}}
	}
	links := w.currentLinks()
	if owner == "" || len(links) == 0 {
		w.setHeld(nil)
		return nil
	}
	devs, err := c.Devices(ctx, links)
	if errors.Is(err, nmbus.ErrNotRunning) {
		w.setHeld(nil)
		return nil
	}
	w.mu.Lock()
	prev := w.held
	w.mu.Unlock()
	held := map[string]string{}
	for _, d := range devs {
		if d.Err != nil {
			// Not read this time (NetworkManager is slow, or the device
			// went away): what was seen stays.
			w.log.Debug("reading NetworkManager's device", "link", d.Name, "err", d.Err)
			if what, ok := prev[d.Name]; ok {
				held[d.Name] = what
			}
			continue
		}
		if !d.Holds() {
			// An up link it does not manage is one it leaves alone (asked
			// by an earlier watch or instance, or by its configuration):
			// its holding the link later is a takeback, not asked again.
			if _, ok := inst.asked[d.Path]; !ok && d.Up && d.Path != "" {
				inst.asked[d.Path] = time.Now()
			}
			delete(inst.refused, d.Name)
			continue
		}
		at, asked := inst.asked[d.Path]
		if !asked || inst.refused[d.Name] != "" && time.Since(at) >= w.retry {
			inst.asked[d.Path] = time.Now()
			if err := c.Unmanage(ctx, d.Path); err != nil {
				inst.refused[d.Name] = err.Error()
				w.log.Debug("NetworkManager did not leave nodeagent's link unmanaged", "link", d.Name, "err", err)
			} else {
				delete(inst.refused, d.Name)
				lvl := slog.LevelDebug
				if !inst.logged[d.Name] {
					inst.logged[d.Name] = true
					lvl = slog.LevelInfo
				}
				w.log.Log(ctx, lvl, "asked NetworkManager to leave nodeagent's link unmanaged", "link", d.Name,
					"held", d.Describe(), "device", string(d.Path))
				if nd, err := c.Device(ctx, d.Name); err == nil && nd.Err == nil {
					d = nd
				}
				if !d.Holds() {
					continue
				}
			}
		}
		held[d.Name] = nmWhat(d, inst.refused[d.Name])
	}
	w.setHeld(held)
	return nil
}

// nmWhat says what NetworkManager does to a link it holds: refused is its
// answer when asked to leave it alone, "" when it let go and took it back.
func nmWhat(d nmbus.Device, refused string) string {
	s := fmt.Sprintf("holds nodeagent's link %s %s", d.Name, d.Describe())
	if refused != "" {
		s += " and did not leave it unmanaged when asked (" + refused + ")"
	} else {
		s += " again after it was asked to leave it unmanaged"
	}
	return s + "; a reapply replaces nodeagent's addresses"
}
