package agent

import (
	"context"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/portfwd"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/dependents"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

// keepPods refuses a teardown that would delete a link which links of other
// network namespaces sit on: pods attached to a VLAN of this node by the
// macvlan CNI plugin. The kernel deletes a macvlan with its lower device,
// so deleting the VLAN would cut the pods off, and their links and
// addresses are not nodeagent's to remove. The operator removes the pods
// first, or says --force.
func keepPods(ctx context.Context, h *host.Host, p netcfg.Plans, log *slog.Logger) error {
	names := p.Link.Deletes()
	deps, err := dependents.Find(ctx, h.NS(), slices.Collect(maps.Keys(names)))
	if err != nil {
		log.Warn("not every network namespace could be searched for links on nodeagent's", "err", err)
	}
	return dependents.Refusal(deps, names, "teardown", "remove those pods first (or their attachments, with CNI DEL), or run nodeagent teardown --force")
}

// removePorts removes the forwarded ports' files (o.PortDir, by default
// beside the default socket): after teardown no device forwards a port,
// and a reader of a file left behind would take a port that reaches
// nothing.
func removePorts(o Options, log *slog.Logger) {
	dir := o.PortDir
	if dir == "" {
		dir = filepath.Join(filepath.Dir(api.DefaultSocket), "pia")
	}
	if err := portfwd.RemoveFiles(dir); err != nil {
		log.Warn("removing the forwarded ports' files", "dir", dir, "err", err)
	}
}
