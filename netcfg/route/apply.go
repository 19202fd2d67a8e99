package route

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Apply executes p and returns the state it reached. Every op that fails is
// reported by its object; the others still run.
func Apply(ctx context.Context, h *host.Host, p Plan) (Observed, error) {
	if p.Empty() {
		return p.Observed, nil
	}
	links := p.Observed.Links
	var errs []error
	for _, o := range p.Ops {
		var err error
		switch o.Kind {
		case OpWriteTables:
			h.Wrote(1)
			err = writeFileAtomic(o.File, o.Tables)
		case OpRemoveTables:
			h.Wrote(1)
			if err = os.Remove(o.File); os.IsNotExist(err) {
				err = nil
			}
		case OpAddRoute, OpReplaceRoute:
			h.Wrote(1)
			// Replace, not add: an owned route left by a crash mid-apply
			// with the same key is simply overwritten, never duplicated.
			err = h.NL().RouteReplace(toKernelRoute(o.Route, links))
		case OpDelRoute:
			h.Wrote(1)
			if err = h.NL().RouteDel(toKernelRoute(o.Route, links)); errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
				err = nil
			}
		case OpAddRule:
			h.Wrote(1)
			if err = h.NL().RuleAdd(toKernelRule(o.Rule)); errors.Is(err, unix.EEXIST) {
				err = nil
			}
		case OpDelRule:
			h.Wrote(1)
			if err = h.NL().RuleDel(toKernelRule(o.Rule)); errors.Is(err, unix.ENOENT) {
				err = nil
			}
		case OpPending:
			err = &host.PendingError{Reason: o.Reason}
		case OpConflict:
			err = errors.New(o.Reason)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err))
		}
	}
	obs, err := Observe(ctx, h, p.Desired)
	if err != nil {
		errs = append(errs, err)
	}
	return obs, errors.Join(errs...)
}

func toKernelRoute(r Route, links map[string]int) *netlink.Route {
	kr := &netlink.Route{
		Table:    r.Table,
		Type:     int(r.Type),
		Protocol: netlink.RouteProtocol(host.Proto),
		Priority: int(r.Metric),
		Scope:    netlink.Scope(r.Scope),
		Family:   family(r.To),
		Dst:      &net.IPNet{IP: r.To.Addr().AsSlice(), Mask: net.CIDRMask(r.To.Bits(), r.To.Addr().BitLen())},
	}
	if r.Via.IsValid() {
		kr.Gw = r.Via.AsSlice()
	}
	if r.Src.IsValid() {
		kr.Src = r.Src.AsSlice()
	}
	if r.Dev != "" {
		kr.LinkIndex = links[r.Dev]
	}
	if r.OnLink {
		kr.Flags |= unix.RTNH_F_ONLINK
	}
	return kr
}

func toKernelRule(r Rule) *netlink.Rule {
	kr := netlink.NewRule()
	kr.Priority = r.Priority
	kr.Family = r.Family
	kr.Protocol = host.Proto
	kr.Type = r.Action
	kr.Invert = r.Invert
	kr.IifName, kr.OifName = r.IIF, r.OIF
	if r.Action == unix.FR_ACT_TO_TBL {
		kr.Table = r.Table
	}
	if r.From.IsValid() {
		kr.Src = &net.IPNet{IP: r.From.Addr().AsSlice(), Mask: net.CIDRMask(r.From.Bits(), r.From.Addr().BitLen())}
	}
	if r.To.IsValid() {
		kr.Dst = &net.IPNet{IP: r.To.Addr().AsSlice(), Mask: net.CIDRMask(r.To.Bits(), r.To.Addr().BitLen())}
	}
	if r.HasMark {
		mask := r.Mask
		kr.Mark, kr.Mask = r.Mark, &mask
	}
	kr.SuppressPrefixlen = r.Suppress
	return kr
}

// writeFileAtomic replaces path with data so a reader never sees half of
// it, and a crash never leaves it empty (fsafe.WriteFile syncs the file
// before the rename and the directory after).
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return fsafe.WriteFile(path, data, 0o644)
}
