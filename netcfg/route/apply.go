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
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Apply executes p (Execute) and returns the state it reached, with the
// report of every op.
func Apply(ctx context.Context, s *host.Snapshot, p Plan) (Observed, plan.Report) {
	return plan.Applied(plan.Routes, Execute(ctx, s, p), p.Observed, func() (Observed, error) { return Observe(ctx, s.After(), p.Desired) })
}

// Execute carries out exactly p's ops and reports each; every op that
// fails is reported by its object and the others still run. A route's
// device is looked up in s, which knows the links created earlier in the
// sync; a route whose device is not there is pending.
func Execute(ctx context.Context, s *host.Snapshot, p Plan) plan.Report {
	r := p.Report()
	if !r.Writes() {
		return r
	}
	h := s.Host()
	links := map[string]int{}
	for name, idx := range p.Observed.Links {
		links[name] = idx
	}
	for _, name := range p.Observed.Coming {
		if idx, err := s.LinkIndex(name); err == nil {
			links[name] = idx
		}
	}
	for i, o := range p.Ops {
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
		case OpAddRoute, OpReplaceRoute, OpAdoptRoute:
			if o.Route.Dev != "" && links[o.Route.Dev] == 0 {
				err = &host.PendingError{Reason: fmt.Sprintf("device %s does not exist yet", o.Route.Dev), Missing: o.Route.Dev}
				break
			}
			h.Wrote(1)
			// Replace, not add: an owned route left by a crash mid-apply
			// with the same key is simply overwritten, never duplicated,
			// and an adopted route takes nodeagent's protocol in place
			// (NLM_F_REPLACE on its key): it is never missing meanwhile.
			err = h.NL().RouteReplace(toKernelRoute(o.Route, links))
			if errors.Is(err, unix.ENETDOWN) && o.Route.Dev != "" {
				// The device exists but is down (a tun made a moment
				// before its program sets it up): the route waits for
				// the device's up event, it has not failed.
				err = &host.PendingError{Reason: fmt.Sprintf("device %s is down", o.Route.Dev)}
			}
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
		case OpAdoptRule:
			err = adoptRule(h, o)
		case OpReleaseRoute:
			h.Wrote(1)
			kr := toKernelRoute(o.Route, links)
			kr.Protocol = unix.RTPROT_BOOT
			err = h.NL().RouteReplace(kr)
		case OpReleaseRule:
			err = releaseRule(h, o)
		case OpDelRule:
			h.Wrote(1)
			if err = h.NL().RuleDel(toKernelRule(o.Rule)); errors.Is(err, unix.ENOENT) {
				err = nil
			}
		default:
			continue // reported as planned
		}
		if err != nil {
			r[i].Err = fmt.Errorf("%s: %w", o.Object(), err)
		}
	}
	return r
}

// adoptRule takes over o.OldRule make-before-break: the packets it matches
// find a rule sending them to the same table at every moment.
//
// nodeagent's rule is added at the same priority first. The kernel puts a
// rule behind every rule of its priority, and it does count the protocol
// when it refuses a duplicate (NLM_F_EXCL), so the two stand side by side,
// the old one first. Then the old one is deleted, given its own protocol:
// the kernel deletes the first rule in list order whose given attributes
// match, and a protocol of 0 (what `ip rule add` leaves) is no filter, so
// the first match is the old rule, ahead of nodeagent's.
//
// A kernel that refuses the duplicate (EEXIST: one whose duplicate check
// ignores the protocol) gets a bridge instead: a temporary rule of
// nodeagent's one priority ahead (behind every rule of that priority, so
// straight before the old one), then the old rule deleted, nodeagent's
// added at the priority, and the temporary one deleted by nodeagent's
// protocol.
func adoptRule(h *host.Host, o Op) error {
	old := toKernelRule(o.Rule)
	old.Protocol = o.OldRule.Proto
	if o.Present {
		h.Wrote(1)
		return ignore(h.NL().RuleDel(old), unix.ENOENT)
	}
	return swapRule(h, toKernelRule(o.Rule), old)
}

// releaseRule hands nodeagent's rule o.Rule back as adoptRule took it,
// the other way round: a copy without nodeagent's protocol (0, what
// `ip rule add` leaves) is added beside it, then nodeagent's is deleted by
// its protocol. A copy there already (a release interrupted between the
// two) is not added again.
func releaseRule(h *host.Host, o Op) error {
	free := toKernelRule(o.Rule)
	free.Protocol = 0
	rules, err := h.RuleList()
	if err != nil {
		return err
	}
	for _, r := range rules {
		if int(r.Protocol) != host.Proto && fromKernelRule(r) == o.Rule {
			h.Wrote(1)
			return ignore(h.NL().RuleDel(toKernelRule(o.Rule)), unix.ENOENT)
		}
	}
	return swapRule(h, free, toKernelRule(o.Rule))
}

// swapRule puts rule add in the place of rule del, make-before-break (see
// adoptRule).
func swapRule(h *host.Host, add, del *netlink.Rule) error {
	h.Wrote(1)
	err := h.NL().RuleAdd(add)
	if err == nil {
		h.Wrote(1)
		return ignore(h.NL().RuleDel(del), unix.ENOENT)
	}
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	if add.Priority < 1 {
		return fmt.Errorf("the kernel refuses a second rule beside the old one, and there is no priority ahead of %d to bridge by: %w", add.Priority, err)
	}
	bridge := *add
	bridge.Priority--
	h.Wrote(1)
	if err := h.NL().RuleAdd(&bridge); err != nil {
		return fmt.Errorf("bridge rule at priority %d: %w", bridge.Priority, err)
	}
	h.Wrote(1)
	if err := ignore(h.NL().RuleDel(del), unix.ENOENT); err != nil {
		// The bridge stays and does the old rule's work; the next sync
		// adds nodeagent's rule before it deletes the bridge, an owned
		// rule no longer desired.
		return err
	}
	h.Wrote(1)
	if err := ignore(h.NL().RuleAdd(add), unix.EEXIST); err != nil {
		return err
	}
	h.Wrote(1)
	return ignore(h.NL().RuleDel(&bridge), unix.ENOENT)
}

// ignore returns err unless it is one of the errnos given.
func ignore(err error, errnos ...unix.Errno) error {
	for _, e := range errnos {
		if errors.Is(err, e) {
			return nil
		}
	}
	return err
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
