package agent

import (
	"context"
	"log/slog"
	"slices"

	"github.com/fsnotify/fsnotify"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// watchNeighbours calls changed (which must not block) whenever a file
// changes in a directory whose files the hazard checks read: networkd's
// search path. A directory made after the start is found by the periodic
// check (hazardsEvery), which also sees a service start or stop.
func watchNeighbours(ctx context.Context, p hazard.Paths, changed func(), log *slog.Logger) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("cannot watch networkd's configuration; it is read every 30 s", "err", err)
		return
	}
	n := 0
	dirs := p.WatchDirs()
	for _, dir := range dirs {
		if w.Add(dir) == nil {
			n++
		}
	}
	if n == 0 {
		w.Close()
		return
	}
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				// A directory of the search path made since (networkd.conf.d
				// for a drop-in) is watched from now on.
				if ev.Has(fsnotify.Create) && slices.Contains(dirs, ev.Name) {
					w.Add(ev.Name)
				}
				changed()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Debug("watching networkd's configuration", "err", err)
				changed()
			}
		}
	}()
}
