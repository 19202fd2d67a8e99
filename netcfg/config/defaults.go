package config

import "time"

// Defaults, named so documentation and tests can refer to them.
const (
	DefaultDADProbes        = 3               // RFC 5227 PROBE_NUM
	DefaultDADInterval      = time.Second     // RFC 5227 PROBE_MIN..PROBE_MAX, fixed
	DefaultDADWait          = 2 * time.Second // RFC 5227 ANNOUNCE_WAIT
	DefaultDADAnnouncements = 2               // RFC 5227 ANNOUNCE_NUM
	DefaultMacvlanMode      = "bridge"
	DefaultWGImplementation = "auto"
	DefaultRuleAction       = "table"
	DefaultRouteType        = "unicast"
	DefaultKubernetesHold   = 30 * time.Second
)

// applyDefaults fills the fields left at their zero value. pos tells which
// keys the file wrote: "announcements: 0" written out means no gratuitous
// ARPs, while leaving it out means the default. pos is nil for a config
// built in code, where zero always means "default".
//
// Node.Name stays empty; the caller fills in the hostname, because reading
// it here would make parsing depend on the machine.
func applyDefaults(c *Config, pos positions) {
	if c.DAD.Probes == 0 {
		c.DAD.Probes = DefaultDADProbes
	}
	if c.DAD.Interval == 0 {
		c.DAD.Interval = DefaultDADInterval
	}
	if c.DAD.Wait == 0 {
		c.DAD.Wait = DefaultDADWait
	}
	if _, written := pos["dad.announcements"]; c.DAD.Announcements == 0 && !written {
		c.DAD.Announcements = DefaultDADAnnouncements
	}
	// Only a config that labels gets a hold, so one without a kubernetes
	// section reads back as it was written.
	if _, written := pos["kubernetes.hold"]; c.Kubernetes.Hold == 0 && !written && c.Kubernetes.Enabled() {
		c.Kubernetes.Hold = DefaultKubernetesHold
	}
	gatewayDefaults(c.Gateway, pos)
	for i := range c.Macvlans {
		if c.Macvlans[i].Mode == "" {
			c.Macvlans[i].Mode = DefaultMacvlanMode
		}
	}
	for i := range c.WireGuard {
		if c.WireGuard[i].Implementation == "" {
			c.WireGuard[i].Implementation = DefaultWGImplementation
		}
	}
	for i := range c.Routing.Rules {
		if r := &c.Routing.Rules[i]; r.Action == "" && r.Table != 0 {
			r.Action = DefaultRuleAction
		}
	}
	for i := range c.Routing.Tables {
		for j := range c.Routing.Tables[i].Routes {
			if r := &c.Routing.Tables[i].Routes[j]; r.Type == "" {
				r.Type = DefaultRouteType
			}
		}
	}
}
