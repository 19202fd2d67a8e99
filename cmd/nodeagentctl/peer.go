package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/cmd/internal/clientqr"
	"github.com/nodeagent/nodeagent/netcfg/clients"
)

// peerOptions are the flags of `peer`.
type peerOptions struct {
	device, description, expires, via, qrPNG string
	ips                                      []string
	fullTunnel, qr                           bool
}

// peerTimeout bounds a peer command: the daemon answers once it has
// applied the change, which a sync with safe apply's probes may take a
// while to do.
const peerTimeout = 90 * time.Second

// addOnly are the flags only peer add takes.
var addOnly = []string{"ip", "description", "expires", "full-tunnel", "via", "qr", "qr-png"}

// qrScale is the PNG's pixels per module: a version 10 code is 57
// modules, so about 500 pixels square with its border.
const qrScale = 8

// peer runs `peer ACTION NAME`.
func (c *cli) peer(ctx context.Context, client *api.Client, action, name string, o peerOptions, fs *pflag.FlagSet) int {
	switch action {
	case "add":
	case "disable", "enable", "remove":
		for _, f := range addOnly {
			if fs.Changed(f) {
				return c.usageError("--%s applies to peer add only", f)
			}
		}
	default:
		return c.usageError("peer %q: want add, disable, enable or remove", action)
	}
	if err := clients.CheckName(name); err != nil {
		return c.usageError("peer %s: %v", action, err)
	}
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	if action != "add" {
		r, err := client.ChangePeer(ctx, action, api.PeerChange{Device: o.device, Name: name})
		if err != nil {
			return c.peerFail(action, name, err)
		}
		what := map[string]string{"disable": "disabled: out of %s, its file kept (%s)", "enable": "enabled: back in %s (%s)", "remove": "removed from %s, its file deleted (%s)"}[action]
		if !r.Changed {
			what = map[string]string{"disable": "was disabled already (%s, %s)", "enable": "was enabled already (%s, %s)", "remove": "removed (%s, %s)"}[action]
		}
		fmt.Fprintf(c.stdout, "%s %s\n", clean(r.Name), fmt.Sprintf(what, clean(r.Device), clean(r.File)))
		return exitOK
	}
	if o.via != "" && !o.fullTunnel {
		return c.usageError("--via %s needs --full-tunnel", o.via)
	}
	var ips []string
	for _, s := range o.ips {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				ips = append(ips, p)
			}
		}
	}
	// The PNG's file is made first, so that a path that cannot be
	// written fails before anything is added.
	var png *os.File
	if o.qrPNG != "" {
		f, err := os.OpenFile(o.qrPNG, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			fmt.Fprintf(c.stderr, "nodeagentctl: --qr-png: %v (it holds the client's private key: give a new file)\n", err)
			return exitFailure
		}
		png = f
		defer func() {
			if png != nil {
				png.Close()
				os.Remove(o.qrPNG)
			}
		}()
	}
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		fmt.Fprintf(c.stderr, "nodeagentctl: peer add: making a key pair: %v\n", err)
		return exitFailure
	}
	r, err := client.AddPeer(ctx, api.PeerAdd{Device: o.device, Name: name, PublicKey: key.PublicKey().String(), IPs: ips,
		Description: o.description, Expires: o.expires, FullTunnel: o.fullTunnel, Via: o.via})
	if err != nil {
		return c.peerFail(action, name, err)
	}
	conf := clients.Config{Name: name + " (" + r.Device + ")", PrivateKey: key.String(), Addresses: r.Addresses, DNS: r.DNS, MTU: r.MTU,
		ServerPublicKey: r.ServerPublicKey, Endpoint: r.Endpoint, AllowedIPs: r.AllowedIPs, Keepalive: r.PersistentKeepalive}
	text := conf.String()
	fmt.Fprint(c.stdout, text)
	if o.qr {
		fmt.Fprintln(c.stdout)
		if err := clientqr.Terminal(c.stdout, text); err != nil {
			fmt.Fprintf(c.stderr, "nodeagentctl: peer add: %v\n", err)
			return exitFailure
		}
	}
	if png != nil {
		err := clientqr.PNG(png, text, qrScale)
		if cerr := png.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintf(c.stderr, "nodeagentctl: peer add: %s: %v (the peer is added; print its config again with a new key by removing and adding it)\n", o.qrPNG, err)
			os.Remove(o.qrPNG)
			png = nil
			return exitFailure
		}
		png = nil
	}
	note := fmt.Sprintf("added %s to %s as %s (%s)", clean(r.Name), clean(r.Device), strings.Join(r.Addresses, ", "), clean(r.File))
	if r.Expires != nil {
		note += ", until " + r.Expires.UTC().Format(time.RFC3339)
	}
	if r.Via != "" {
		note += ", its internet through " + clean(r.Via)
	}
	fmt.Fprintf(c.stderr, "nodeagentctl: %s; the private key above is the only copy: the node keeps none\n", note)
	if o.qrPNG != "" {
		fmt.Fprintf(c.stderr, "nodeagentctl: QR code written to %s; delete it once scanned\n", o.qrPNG)
	}
	return exitOK
}

// peerFail reports a peer command's error: the daemon's reason for a
// refusal, without the HTTP status.
func (c *cli) peerFail(action, name string, err error) int {
	var he *api.HTTPError
	if errors.As(err, &he) && slices.Contains([]int{400, 404, 409, 501, 503}, he.Code) {
		fmt.Fprintf(c.stderr, "nodeagentctl: peer %s %s: %s\n", action, name, he.Message)
		return exitFailure
	}
	return c.fail("peer "+action+" "+name, err)
}
