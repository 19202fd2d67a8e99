package agent

import (
	"context"
	"log/slog"

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
	for _, dir := range p.WatchDirs() {
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
			case _, ok := <-w.Events:
				if !ok {
					return
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
