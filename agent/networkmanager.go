package agent

import (
	"context"
	"log/slog"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// nmWatch follows NetworkManager over D-Bus for the Coexistence condition.
type nmWatch struct{}

// startNetworkManager starts following NetworkManager; changed is called
// (it must not block) when what it holds about nodeagent's links changes.
func startNetworkManager(ctx context.Context, log *slog.Logger, changed func()) *nmWatch {
	return &nmWatch{}
}

// hazards says which of links NetworkManager holds as its own, from what
// the watch last saw; it never blocks. links are nodeagent's link names.
func (w *nmWatch) hazards(links []string) []hazard.Hazard {
	return nil
}
