// Package config loads /etc/nodeagent/nodeagent.yaml: one YAML document
// describing the node's VLANs, macvlan shims, WireGuard interfaces, policy
// routing, nftables NAT and kill switch, sysctls and Node labels.
// examples/homelab.yaml is a complete, commented example.
//
// # Loading
//
// Load reads a file and calls Parse; ParseWith and LoadWith take Options.
// Parsing walks the gopkg.in/yaml.v3 node tree itself rather than using
// yaml.Unmarshal, so that it can
//
//   - report every problem at once, not only the first;
//   - name each problem's file, line and field path, as
//     nodeagent.yaml:7: vlans[0].mtuu: unknown field (did you mean "mtu"?);
//   - reject unknown keys anywhere (a misspelt key is otherwise silently
//     ignored, and its setting silently missing);
//   - reject values of the wrong type ("50" where an integer belongs,
//     a list where a mapping belongs) instead of coercing them.
//
// Anchors, aliases and merge keys (<<: *base) work. An empty file is an
// empty config; a file with a second YAML document is an error.
//
// Field paths in errors use the YAML names: vlans[1].id,
// routing.rules[0].table, sysctls.net.ipv4.ip_forward and
// kubernetes.labels["homelab.example/vpn-ingress"].
//
// # Errors
//
// Problems are returned as an ErrorList of *FieldError, sorted by line. Its
// Error method prints one "file:line: field: message" per line, which
// editors and CI can jump to. Parse returns the partially filled *Config
// even when it returns an error.
//
// # Defaults
//
// After decoding, zero values get defaults: DAD probes 3, interval 1s, wait
// 2s, announcements 2 (an explicit "announcements: 0" is kept); macvlan
// mode bridge; WireGuard implementation auto; rule action table when a
// table is given; route type unicast. An MTU of 0 leaves the kernel's
// default. Node.Name stays empty: the daemon fills in the hostname.
//
// # Validation
//
// Parse calls (*Config).Validate, which checks each value's syntax
// (interface names, addresses and prefixes, VLAN IDs, MTUs, ports,
// WireGuard keys, fwmarks, sysctl keys, Kubernetes label keys and values)
// and the config as a whole: unique link names, VLAN (parent, id) pairs,
// table ids and names, rule priorities, addresses and peer keys; rules that
// name declared tables; a link's MTU not above its declared parent's;
// labels the node's own identity may set under NodeRestriction. Key and
// credential files must be absolute paths and, when they exist, must not be
// readable by group or others (Options.SkipFileChecks turns the look at the
// disk off). What can only be known from the running kernel, such as the
// MTU of a physical parent, is checked when planning, not here.
package config
