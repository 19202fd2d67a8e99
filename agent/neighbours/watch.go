package neighbours

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fsnotify/fsnotify"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// watchNeighbours calls changed (which must not block) whenever a file
// changes in a directory whose files the hazard checks read: networkd's
// and udev's search path, their drop-in directories (NAME.network.d,
// NAME.link.d, networkd.conf.d) and ifupdown's /etc/network. A directory
// of the search path made after the start is watched once its parent
// sees it made; one whose parent is missing too is found by the periodic
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
			n += watchDropIns(w, dir)
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
				// for a drop-in), or a drop-in directory, is watched from now
				// on: a file written into it at once is seen when the
				// directory's creation is looked at.
				if ev.Has(fsnotify.Create) && (slices.Contains(dirs, ev.Name) || isDropInDir(ev.Name)) {
					if w.Add(ev.Name) == nil {
						watchDropIns(w, ev.Name)
					}
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

// maxDropInDirs bounds the drop-in directories watched in one directory.
const maxDropInDirs = 256

// watchDropIns watches the drop-in directories in dir; it returns how
// many.
func watchDropIns(w *fsnotify.Watcher, dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if n >= maxDropInDirs {
			break
		}
		if e.IsDir() && isDropInDir(e.Name()) && w.Add(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}

// isDropInDir reports whether a directory's name is a drop-in
// directory's: NAME.network.d, NAME.link.d, NAME.conf.d.
func isDropInDir(name string) bool {
	base := filepath.Base(name)
	return strings.HasSuffix(base, ".network.d") || strings.HasSuffix(base, ".link.d") || strings.HasSuffix(base, ".conf.d")
}
