package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodeagent/nodeagent/cmd/internal/cliflags"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/importer"
	"github.com/spf13/pflag"
)

const importUsage = `nodeagent import reads what this node has (VLANs, macvlans, WireGuard devices
and their wg-quick files, policy routing rules and tables, a few sysctls) and
writes a nodeagent config that takes it over in place (adopt: true), with the
key and peer files the config names. It changes nothing on the node.

Usage:
  nodeagent import --out DIR [--root DIR] [--only NAME]... [--etc DIR]

It takes over only what the old setup made: its VLANs, macvlans and
WireGuard devices, and the policy routing that belongs to them (a table whose
routes go through one of them, a rule that matches one of them or looks up
such a table). Every other rule and table (a CNI's such as Cilium, Tailscale's,
kube-router's) is listed in the config as a comment with its likely owner and
is never adopted. An IPv6 source-specific route (from) is listed, never taken.

It writes only into DIR, never into /etc:
  DIR/nodeagent.yaml                 the config, with comments (0644)
  DIR/import-notes.txt               the wg-quick hook lines, which may hold a
                                     token or a password (0600); the config
                                     says what each did, never its text
  DIR/keys/DEVICE.key                each WireGuard device's private key (0600)
  DIR/keys/DEVICE/PEER.psk           each preshared key (0600)
  DIR/peers/DEVICE/PEER.conf         one wg-quick [Peer] file per peer (0644);
  DIR/peers/DEVICE/PEER.yaml         PEER.yaml for a peer with a preshared key
and every directory 0700. DIR must not exist or be an empty directory of
yours, and must not be the --root directory or inside it; every directory on
the way to it must be root's or yours and writable by no one else (a sticky
one such as /tmp excepted), so that no one can swap the keys before you
install them. Everything is written into a new directory beside DIR and
renamed into place: a failure leaves nothing behind.

Then it prints the config's path, the notes (what was not imported, what
could not be read) and the switch-over steps, which are left to you: install
the files, validate, plan (only adoptions), retire what made the links
(systemd-networkd, netplan, ifupdown or NetworkManager files, each with its
exact step; units that run ip link add), disable (not stop) wg-quick@DEVICE,
enable nodeagent, reboot.

Flags:
  -o, --out DIR    where to write (required)
      --root DIR   where the files will be installed; every path in the config
                   is under it (default /etc/nodeagent)
      --only NAME  import only this object (repeat it, or give a comma list):
                   a VLAN's, macvlan's or WireGuard device's name (with the
                   policy routing that belongs to it), a routing table's name
                   or id (whoever made it), rules (every rule but the kernel's
                   own, with the tables they look up) or sysctls; a wg-quick
                   device that is down and not enabled is imported only so
      --etc DIR    read /etc's files (/etc/wireguard, /etc/iproute2/rt_tables,
                   /etc/systemd/system, /etc/systemd/network, /etc/netplan,
                   /etc/network/interfaces, /etc/NetworkManager) from DIR
                   instead (default /etc)
  -h, --help       this help

Sysctls read: net.ipv4.ip_forward, net.ipv6.conf.all.forwarding,
net.ipv4.conf.all.src_valid_mark, net.ipv4.conf.{all,default}.rp_filter and the
rp_filter of each imported link; one is imported when it is not the kernel's
default (a link's: not default.rp_filter's value).

Run it as root: WireGuard keys and peers (and /etc/wireguard) are readable by
root only. Without root it still writes what it could read, and says what it
could not.

Exit status: 0 written, 1 failure, 2 usage error.
`

// runImport is nodeagent import: its own flags, so it is dispatched before
// the other commands' flags are parsed.
func runImport(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("nodeagent import", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.StringP("out", "o", "", "output directory")
	root := fs.String("root", importer.DefaultRoot, "install root")
	only := fs.StringSlice("only", nil, "objects to import")
	etc := fs.String("etc", "/etc", "directory standing for /etc")
	help := fs.BoolP("help", "h", false, "help")
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nodeagent import: "+format+"\n", a...)
		fmt.Fprintln(stderr, "usage: nodeagent import --out DIR [--root DIR] [--only NAME]... [--etc DIR] (nodeagent import --help for more)")
		return 2
	}
	if err := cliflags.SingleDashLong(fs, args); err != nil {
		return usageErr("%v", err)
	}
	if err := fs.Parse(args); err != nil {
		return usageErr("%v", err)
	}
	if *help {
		io.WriteString(stdout, importUsage)
		return 0
	}
	if fs.NArg() > 0 {
		return usageErr("takes no arguments, got %q (the directory is --out DIR)", fs.Args())
	}
	if *out == "" {
		return usageErr("--out DIR is required: the directory to write the config and its files into")
	}
	if !filepath.IsAbs(*root) {
		return usageErr("--root %s: not an absolute path", *root)
	}
	outAbs, err := filepath.Abs(*out)
	if err != nil {
		return usageErr("--out %s: %v", *out, err)
	}
	if within(resolve(outAbs), resolve(filepath.Clean(*root))) {
		return usageErr("--out %s is --root %s or inside it; write elsewhere and install the files by the steps printed", *out, *root)
	}
	var names []string
	for _, n := range *only {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}

	h, err := host.Current()
	if err != nil {
		fmt.Fprintf(stderr, "nodeagent import: netlink: %v\n", err)
		return 1
	}
	defer h.Close()
	s, err := importer.Read(context.Background(), h, importer.ReadOptions{Etc: *etc})
	if err != nil {
		fmt.Fprintf(stderr, "nodeagent import: reading the node: %v\n", err)
		return 1
	}
	r, err := importer.Build(s, importer.Options{Root: *root, Only: names, Out: *out})
	if err != nil {
		fmt.Fprintf(stderr, "nodeagent import: %v\n", err)
		return 1
	}
	if err := importer.WriteOut(*out, r); err != nil {
		fmt.Fprintf(stderr, "nodeagent import: writing %s: %v\n", *out, err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "nodeagent import: not run as root: WireGuard keys and peers and /etc/wireguard could not be read (see the notes); run it as root to import them")
	}
	fmt.Fprintf(stdout, "wrote %s and %d file(s) under %s\n", filepath.Join(*out, importer.ConfigName), len(r.Files), *out)
	if r.Private != "" {
		fmt.Fprintf(stdout, "the hook lines, which may hold secrets, are in %s (root's only), never in the config\n", filepath.Join(*out, importer.NotesName))
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(stdout, "\nnotes:")
		for _, n := range r.Notes {
			fmt.Fprintf(stdout, "  - %s\n", n)
		}
	}
	if len(r.Steps) == 0 {
		return 0
	}
	fmt.Fprintln(stdout, "\nsteps (as root, in order; read the config's comments first):")
	for i, st := range r.Steps {
		fmt.Fprintf(stdout, "  %d. %s\n", i+1, st)
	}
	return 0
}

// resolve is path with its links resolved as far as it exists.
func resolve(path string) string {
	p, err := filepath.EvalSymlinks(path)
	if err == nil {
		return p
	}
	if errors.Is(err, os.ErrNotExist) && filepath.Dir(path) != path {
		return filepath.Join(resolve(filepath.Dir(path)), filepath.Base(path))
	}
	return path
}

// within reports whether path is dir or inside it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
