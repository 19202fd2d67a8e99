package neighbours

import (
	"context"
	"errors"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/nmbus"
	"github.com/nodeagent/nodeagent/netcfg/sdbus"
)

// sdRetry is how long the systemd watch waits to connect again after the
// bus is missing or lost, and how often it asks again without a signal.
const sdRetry = 30 * time.Second

// sdSettle coalesces a burst of signals (networkd restarting) into one
// read.
const sdSettle = 300 * time.Millisecond

// watchSystemd keeps what systemd says (sdbus.Facts) fresh: at the start,
// whenever networkd's bus name changes owner (it starts or stops), and
// every sdRetry. While the bus does not answer, networkd is taken not to
// run and the facts say why.
func (n *Neighbours) watchSystemd(ctx context.Context) {
	for {
		err := n.systemdSession(ctx)
		n.setFacts(sdbus.Facts{}, err)
		if ctx.Err() != nil {
			return
		}
		n.o.Log.Debug("systemd's bus", "err", err, "retry", sdRetry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(sdRetry):
		}
	}
}

func (n *Neighbours) systemdSession(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, nmbus.CallTimeout)
	c, err := nmbus.Dial(dctx, n.o.BusAddress)
	if err == nil {
		if err = c.WatchName(dctx, sdbus.Networkd); err != nil {
			c.Close()
		}
	}
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	tick := time.NewTicker(sdRetry)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		f, err := sdbus.Read(rctx, c)
		cancel()
		if err != nil {
			return err
		}
		n.setFacts(f, nil)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.Done():
			return errors.New("connection to the bus lost")
		case <-tick.C:
		case <-c.Events():
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(sdSettle):
			}
			select {
			case <-c.Events():
			default:
			}
		}
	}
}

// setFacts keeps f, and tells the daemon when what it says changed.
func (n *Neighbours) setFacts(f sdbus.Facts, err error) {
	n.mu.Lock()
	same := f == n.facts
	if same && err == nil {
		n.factsErr = nil
	}
	n.facts, n.factsErr = f, err
	n.mu.Unlock()
	if !same {
		if err == nil {
			n.o.Log.Debug("systemd says", "facts", f.String())
		}
		n.changed()
	}
}
