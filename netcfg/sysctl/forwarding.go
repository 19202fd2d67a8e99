package sysctl

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/host"
)

// IsForwarding reports whether key is one that turns packet forwarding on
// or off: net.ipv4.ip_forward, or net.ipv4.conf.X.forwarding and
// net.ipv6.conf.X.forwarding for any X.
func IsForwarding(key string) bool {
	if key == "net.ipv4.ip_forward" {
		return true
	}
	segs := strings.Split(key, ".")
	return len(segs) == 5 && (segs[1] == "ipv4" || segs[1] == "ipv6") && segs[2] == "conf" && segs[4] == "forwarding"
}

// HoldForwarding returns p with every op that would turn forwarding on
// replaced by a failure that says why, and the keys it held. A kill switch
// that cannot be armed must not meet a node that starts forwarding: the
// traffic it should hold back would leave by whatever route there is.
func (p Plan) HoldForwarding(why string) (Plan, []string) {
	var held []string
	ops := make([]Op, len(p.Ops))
	for i, o := range p.Ops {
		if o.Kind == OpSet && IsForwarding(o.Key) && !equalValue(o.New, "0") {
			held = append(held, o.Key)
			reason := "held at " + show(o.Old) + ", not set to " + show(normalize(o.New)) + ": " + why
			if o.NewIface {
				reason = "not set to " + show(normalize(o.New)) + " on the new interface: " + why
			}
			o = Op{Kind: OpFail, Key: o.Key, Old: o.Old, New: o.New, Reason: reason}
		}
		ops[i] = o
	}
	p.Ops = ops
	return p, held
}

// ForwardingOn returns the forwarding keys that are on now: ip_forward and
// the conf.all.forwarding of IPv6 (which the per-interface IPv6 keys follow
// unless set one by one), plus every forwarding key d names.
func ForwardingOn(ctx context.Context, snap *host.Snapshot, d Desired) ([]string, error) {
	keys := map[string]string{"net.ipv4.ip_forward": "", "net.ipv6.conf.all.forwarding": ""}
	for k := range d.Values {
		if names, err := parseKey(k); err == nil && IsForwarding(keyOf(names)) {
			keys[k] = ""
		}
	}
	o, err := Observe(ctx, snap, Desired{Root: d.Root, Values: keys})
	if err != nil {
		return nil, err
	}
	var on []string
	for _, k := range slices.Sorted(maps.Keys(o.Keys)) {
		if ok := o.Keys[k]; ok.Exists && ok.Unreadable == "" && !equalValue(ok.Raw, "0") {
			on = append(on, k)
		}
	}
	return on, nil
}
