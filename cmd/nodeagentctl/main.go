// Command nodeagentctl asks the local nodeagent daemon, over its unix
// socket, what state the node is in, what a sync would change, and to
// reload its config; `wait` blocks a boot step until the node's networking
// has converged. It only parses flags and prints; the client is agent/api.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/cmd/internal/cliflags"
	"github.com/spf13/pflag"
)

var version = "dev" // set with -ldflags "-X main.version=..."

// Exit codes.
const (
	exitOK = 0
	// exitFailure: the daemon answered, and the answer is no (not ready,
	// degraded, rejected, refused), or wait timed out.
	exitFailure = 1
	// exitUnreachable: there was no answer, so a script can tell "the
	// daemon is down" from "the node is not ready".
	exitUnreachable = 2
	exitUsage       = 2
)

// defaultTimeout is how long wait waits without --timeout.
const defaultTimeout = 5 * time.Minute

// pollInterval is how often wait asks the daemon.
const pollInterval = 250 * time.Millisecond

const usage = `nodeagentctl talks to the local nodeagent daemon over its unix socket.

Usage:
  nodeagentctl status [-o table|json]   the node's state: readiness, conditions, subsystems, WireGuard
                                        devices and peers, PIA tunnels (step, server, peer IP, handshake,
                                        token refresh, last error), pending and failed objects, the last
                                        rejected reload and the last rollback
  nodeagentctl plan                     what a sync would change now (+ add, ~ change, - remove, ! cannot)
  nodeagentctl reload                   re-read the config (root only); a rejected config is not applied
                                        and the running one stays
  nodeagentctl peers [-o table|json]    WireGuard devices and their peers: state (live, idle, disabled,
                                        expired), last handshake, bytes received and sent, as of now
  nodeagentctl peer add NAME [--device DEV] [--ip ADDR]... [--description TEXT] [--expires WHEN]
                   [--full-tunnel [--via PIADEV]] [--qr] [--qr-png FILE]
                                        add a remote-access client: the next free address of the
                                        device's subnets (or --ip), a key pair made here (the private
                                        key is printed, never sent to the daemon nor stored on the
                                        node), its peer file written into peersDir; once the daemon
                                        has applied it, print the client's wg-quick config, with --qr
                                        as a QR code the WireGuard apps scan, and with --qr-png FILE
                                        (created, mode 0600) as a PNG. WHEN: 30d, 12h, ... or RFC 3339
  nodeagentctl peer disable|enable|remove NAME [--device DEV]
                                        take a client out of its device keeping its file (disable),
                                        put it back (enable), or delete its file (remove); each returns
                                        once the device is so
  nodeagentctl port [DEVICE]            the port PIA forwards to DEVICE (or the only PIA device): the
                                        number alone, for scripts; exit 1 when there is none (none bound
                                        yet, or lost after 15 minutes without a good bind)
  nodeagentctl port --retry [DEVICE]    run DEVICE's portForward.onChange now (every PIA device's
                                        without DEVICE), also after credentials were refused (root only)
  nodeagentctl wait [--for=COND] [--timeout=DUR]
                                        poll every 250ms until COND holds; COND is ready (the default:
                                        converged with nothing failed, as READY=1; a degraded node is
                                        ready), healthy (ready and not degraded: what status exits 0
                                        for) or condition/NAME[=STATUS], STATUS True (the default),
                                        False or Unknown
  nodeagentctl completion bash|zsh      print a shell completion script
  nodeagentctl version                  print the version (also --version)
  nodeagentctl help                     this help (also -h, --help)

Flags (accepted before or after the command):
      --socket PATH     the daemon's socket (default ` + api.DefaultSocket + `;
                        env NODEAGENT_SOCKET)
  -o, --output FORMAT   with status and peers: table (default) or json (the API's JSON)
      --for COND        with wait: what to wait for (default ready)
      --timeout DUR     with wait: give up after DUR, e.g. 90s or 2m (default 5m; must be > 0)
      --retry           with port: run the port hook now rather than print the port
      --device DEV      with peer: the WireGuard device (default: the only one with clients)
      --ip ADDR         with peer add: the client's address instead of the next free one (once per
                        family; a comma-separated list is taken too)
      --description T   with peer add: who or what the client is, kept in its peer file
      --expires WHEN    with peer add: the client leaves the device then (30d, 2w, 12h, or
                        2027-01-31T18:00:00Z); it stays listed as expired
      --full-tunnel     with peer add: the client sends all its traffic (0.0.0.0/0, ::/0) into
                        the tunnel, not only clients.allowedIPs
      --via PIADEV      with peer add --full-tunnel: the client's internet leaves by that PIA
                        tunnel under its kill switch (an address from clients.egress's pool)
      --qr              with peer add: also print the config as a QR code
      --qr-png FILE     with peer add: also write the QR code to FILE (a new file, mode 0600)
      --version         print the version
  -h, --help            this help

With -o json, an error is also printed on standard output as a JSON object,
{"error": "...", "hint": "..."}, so that a script reading it gets JSON either
way.

wait fails closed. While the socket is missing or refuses connections it keeps
polling, because at boot the daemon may start after the unit that waits for it;
if --timeout passes before COND holds, it exits 1 with the last reason seen. So
a unit with ExecStartPre=nodeagentctl wait --for=ready --timeout=2m does not
start on a node whose networking never converged. To start it anyway, say so:
ExecStartPre=-nodeagentctl ... (systemd ignores the failure).

Exit status:
  status      0 ready and not degraded, 1 not ready or degraded, 2 daemon unreachable
  wait        0 COND holds, 1 timed out, interrupted or refused (a 4xx reply); an unreachable
              daemon is waited for, not reported
  plan, peers 0 success, 1 failure (plan: something could not be planned), 2 daemon unreachable
  port        0 printed, 1 no port (yet, or lost) or no such device, 2 daemon unreachable or several devices;
              with --retry 0 the hook runs, 1 refused (not root, no hook, no port yet), 2 unreachable
  reload      0 reloaded, 1 config rejected or reload refused (not root), 2 daemon unreachable
  peer        0 done (applied), 1 refused (a name in use, a full subnet, no clients.endpoint, no
              such peer) or not applied in time (nothing is left written), 2 daemon unreachable
  any         2 usage error
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &cli{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, now: time.Now, poll: pollInterval}
	os.Exit(c.run(ctx, os.Args[1:]))
}

// cli is one invocation. Its dependencies are fields so tests can fix the
// environment, the clock and the poll interval.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	poll           time.Duration
	// jsonErrors: -o json was asked for, so errors are printed as JSON on
	// stdout too.
	jsonErrors bool
}

// commands lists each command with the flags (besides --socket and --help)
// and the number of arguments it takes.
var commands = map[string]struct {
	flags []string
	args  int
	// optional: up to args arguments.
	optional bool
}{
	"port":       {[]string{"retry"}, 1, true},
	"status":     {[]string{"output"}, 0, false},
	"plan":       {nil, 0, false},
	"reload":     {nil, 0, false},
	"peers":      {[]string{"output"}, 0, false},
	"wait":       {[]string{"for", "timeout"}, 0, false},
	"peer":       {[]string{"device", "ip", "description", "expires", "full-tunnel", "via", "qr", "qr-png"}, 2, false},
	"completion": {nil, 1, false},
	"version":    {nil, 0, false},
	"help":       {nil, 0, false},
}

// options are the parsed flags.
type options struct {
	socket  string
	output  string
	forCond string
	timeout time.Duration
	retry   bool
	help    bool
	version bool
	peer    peerOptions
}

func newFlagSet(o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("nodeagentctl", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.socket, "socket", api.DefaultSocket, "the daemon's socket")
	fs.StringVarP(&o.output, "output", "o", "table", "table or json")
	fs.StringVar(&o.forCond, "for", "ready", "what wait waits for")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "how long wait waits")
	fs.BoolVar(&o.retry, "retry", false, "run the port hook now")
	fs.StringVar(&o.peer.device, "device", "", "the WireGuard device")
	fs.StringSliceVar(&o.peer.ips, "ip", nil, "the client's addresses")
	fs.StringVar(&o.peer.description, "description", "", "the client's description")
	fs.StringVar(&o.peer.expires, "expires", "", "when the client leaves the device")
	fs.BoolVar(&o.peer.fullTunnel, "full-tunnel", false, "all the client's traffic into the tunnel")
	fs.StringVar(&o.peer.via, "via", "", "the PIA device the client's internet leaves by")
	fs.BoolVar(&o.peer.qr, "qr", false, "print a QR code")
	fs.StringVar(&o.peer.qrPNG, "qr-png", "", "write a QR code PNG")
	fs.BoolVarP(&o.help, "help", "h", false, "help")
	fs.BoolVar(&o.version, "version", false, "print the version")
	return fs
}

func (c *cli) usageError(format string, args ...any) int {
	fmt.Fprintf(c.stderr, "nodeagentctl: "+format+"\n\n", args...)
	fmt.Fprint(c.stderr, usage)
	return exitUsage
}

func (c *cli) run(ctx context.Context, args []string) int {
	var o options
	fs := newFlagSet(&o)
	if err := cliflags.SingleDashLong(fs, args); err != nil {
		return c.usageError("%v", err)
	}
	if err := fs.Parse(args); err != nil {
		return c.usageError("%v", err)
	}
	if o.help || fs.Arg(0) == "help" {
		fmt.Fprint(c.stdout, usage)
		return exitOK
	}
	if o.version {
		fmt.Fprintln(c.stdout, "nodeagentctl", version)
		return exitOK
	}
	if fs.NArg() == 0 {
		return c.usageError("no command")
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	cmd, ok := commands[name]
	if !ok {
		return c.usageError("unknown command %q", name)
	}
	var misplaced string
	fs.Visit(func(f *pflag.Flag) {
		if f.Name != "socket" && !slices.Contains(cmd.flags, f.Name) && misplaced == "" {
			misplaced = f.Name
		}
	})
	if misplaced != "" {
		return c.usageError("--%s does not apply to %s", misplaced, name)
	}
	if len(rest) != cmd.args && !(cmd.optional && len(rest) < cmd.args) {
		if cmd.optional {
			return c.usageError("%s takes at most %d argument, got %d", name, cmd.args, len(rest))
		}
		if cmd.args == 0 {
			return c.usageError("%s takes no arguments, got %q", name, rest)
		}
		return c.usageError("%s takes %d argument, got %d", name, cmd.args, len(rest))
	}
	if o.output != "table" && o.output != "json" {
		return c.usageError("-o %q: want table or json", o.output)
	}
	// The flag wins over the environment, which wins over the default.
	if !fs.Changed("socket") {
		if env := c.getenv("NODEAGENT_SOCKET"); env != "" {
			o.socket = env
		}
	}
	// A script that asked for JSON gets JSON on errors too.
	c.jsonErrors = o.output == "json"
	client := api.NewClient(o.socket)
	defer client.CloseIdleConnections()

	switch name {
	case "status":
		return c.status(ctx, client, o.output)
	case "plan":
		return c.plan(ctx, client)
	case "reload":
		return c.reload(ctx, client)
	case "peers":
		return c.peers(ctx, client, o.output)
	case "peer":
		return c.peer(ctx, client, rest[0], rest[1], o.peer, fs)
	case "port":
		if o.retry {
			return c.portRetry(ctx, client, rest)
		}
		return c.port(ctx, client, rest)
	case "wait":
		target, err := parseFor(o.forCond)
		if err != nil {
			return c.usageError("--for: %v", err)
		}
		if o.timeout <= 0 {
			return c.usageError("--timeout %v: must be > 0", o.timeout)
		}
		return c.wait(ctx, client, target, o.timeout)
	case "completion":
		script, ok := completions[rest[0]]
		if !ok {
			return c.usageError("completion %q: want bash or zsh", rest[0])
		}
		fmt.Fprint(c.stdout, script)
		return exitOK
	case "version":
		fmt.Fprintln(c.stdout, "nodeagentctl", version)
		return exitOK
	}
	panic("unreachable: command " + name + " is listed but not dispatched")
}

// fail reports a request's error and returns its exit code: 2 when the
// daemon could not be reached, 1 when it answered with a failure. The
// message says what to do next where that is known; with -o json it is
// also printed as a JSON object on standard output.
func (c *cli) fail(what string, err error) int {
	code, msg := exitFailure, what+": "+err.Error()
	if errors.Is(err, api.ErrUnreachable) {
		// The error names the socket and the reason.
		code, msg = exitUnreachable, err.Error()
	}
	hint := nextStep(err)
	fmt.Fprintf(c.stderr, "nodeagentctl: %s\n", msg)
	if hint != "" {
		fmt.Fprintf(c.stderr, "nodeagentctl: %s\n", hint)
	}
	if c.jsonErrors {
		b, _ := json.MarshalIndent(jsonError{Error: msg, Hint: hint}, "", "  ")
		c.stdout.Write(append(b, '\n'))
	}
	return code
}

// jsonError is what -o json prints on standard output for an error.
type jsonError struct {
	Error string `json:"error"`
	Hint  string `json:"hint,omitempty"`
}

// nextStep says what to do about a request's error, or "" when there is
// nothing more useful to say than the error itself.
func nextStep(err error) string {
	if !errors.Is(err, api.ErrUnreachable) {
		return ""
	}
	switch {
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return "the socket is for root and the nodeagent group: run this with sudo, or join the group " +
			"(sudo usermod -aG nodeagent $USER, then log in again)"
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED):
		return "is the daemon running, on this socket? See: systemctl status nodeagent"
	}
	return ""
}

func (c *cli) printJSON(v any) int {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fmt.Fprintf(c.stderr, "nodeagentctl: %v\n", err)
		return exitFailure
	}
	c.stdout.Write(append(b, '\n'))
	return exitOK
}

func (c *cli) status(ctx context.Context, client *api.Client, output string) int {
	s, err := client.Status(ctx)
	if err != nil {
		return c.fail("status", err)
	}
	if output == "json" {
		if code := c.printJSON(s); code != exitOK {
			return code
		}
	} else {
		renderStatus(c.stdout, s, c.now())
	}
	if !healthy(s) {
		return exitFailure
	}
	return exitOK
}

// healthy reports whether s is what /readyz answers 200 for, which is what
// status exits 0 for and wait --for=healthy waits for.
func healthy(s *api.Status) bool { return s.Ready && !s.Degraded }

func (c *cli) plan(ctx context.Context, client *api.Client) int {
	p, err := client.Plan(ctx)
	if err != nil {
		return c.fail("plan", err)
	}
	for _, w := range p.Warnings {
		fmt.Fprintf(c.stdout, "warning: %s\n", clean(w))
	}
	for _, l := range p.Lines {
		fmt.Fprintln(c.stdout, clean(l))
	}
	if p.Error != "" {
		// A partial plan is printed, but it is not the whole answer.
		fmt.Fprintf(c.stderr, "nodeagentctl: plan incomplete: %s\n", clean(p.Error))
		return exitFailure
	}
	if len(p.Lines) == 0 {
		fmt.Fprintln(c.stdout, "no changes")
	}
	return exitOK
}

func (c *cli) reload(ctx context.Context, client *api.Client) int {
	r, err := client.Reload(ctx)
	var herr *api.HTTPError
	if errors.As(err, &herr) && herr.Code == http.StatusForbidden {
		fmt.Fprintf(c.stderr, "nodeagentctl: reload needs root; run it with sudo (the daemon said %s)\n", herr)
		return exitFailure
	}
	if err != nil {
		return c.fail("reload", err)
	}
	if !r.Applied {
		fmt.Fprintf(c.stderr, "nodeagentctl: reload rejected; the running config (%s) stays:\n", r.ConfigHash)
		for _, e := range r.Errors {
			fmt.Fprintf(c.stderr, "  %s\n", clean(e))
		}
		return exitFailure
	}
	fmt.Fprintf(c.stdout, "reloaded (config %s)\n", r.ConfigHash)
	return exitOK
}

// port prints the port PIA forwards to the PIA device named (or the only
// one), and nothing else, for scripts; exit 1 when there is none.
func (c *cli) port(ctx context.Context, client *api.Client, args []string) int {
	s, err := client.Status(ctx)
	if err != nil {
		return c.fail("port", err)
	}
	var found []api.PIATunnel
	for _, t := range s.PIA {
		if len(args) == 0 || t.Device == args[0] {
			found = append(found, t)
		}
	}
	switch {
	case len(found) == 0 && len(args) > 0:
		fmt.Fprintf(c.stderr, "nodeagentctl: port: no PIA device %q\n", clean(args[0]))
		return exitFailure
	case len(found) == 0:
		fmt.Fprintln(c.stderr, "nodeagentctl: port: no PIA device")
		return exitFailure
	case len(found) > 1:
		fmt.Fprintln(c.stderr, "nodeagentctl: port: several PIA devices; name one")
		return exitUsage
	case found[0].ForwardedPort == 0:
		why := "none forwarded yet"
		if l := found[0].PortLost; l != nil {
			why = fmt.Sprintf("port %d lost since %s (no good bind for 15 minutes; closed until one is bound again)", l.Port, l.Since.UTC().Format(time.RFC3339))
		}
		if found[0].PortError != "" {
			why += ": " + clean(found[0].PortError)
		}
		fmt.Fprintf(c.stderr, "nodeagentctl: port: %s: %s\n", clean(found[0].Device), why)
		return exitFailure
	}
	fmt.Fprintln(c.stdout, found[0].ForwardedPort)
	return exitOK
}

// portRetry asks the daemon to run a device's port hook now.
func (c *cli) portRetry(ctx context.Context, client *api.Client, args []string) int {
	dev := ""
	if len(args) > 0 {
		dev = args[0]
	}
	r, err := client.RetryPortHook(ctx, dev)
	if err != nil {
		var he *api.HTTPError
		if errors.As(err, &he) && he.Code == http.StatusConflict {
			// The daemon's reason is in the body, which do turned into
			// the error's message.
			fmt.Fprintf(c.stderr, "nodeagentctl: port --retry: %s\n", clean(he.Message))
			return exitFailure
		}
		return c.fail("port --retry", err)
	}
	for _, d := range r.Devices {
		fmt.Fprintf(c.stdout, "%s: port hook runs now (nodeagentctl status shows how it went)\n", clean(d))
	}
	return exitOK
}

func (c *cli) peers(ctx context.Context, client *api.Client, output string) int {
	devs, err := client.Peers(ctx)
	if err != nil {
		return c.fail("peers", err)
	}
	if output == "json" {
		if devs == nil {
			devs = []api.WireGuardDevice{} // [] rather than null for jq
		}
		return c.printJSON(devs)
	}
	renderPeers(c.stdout, devs, c.now())
	return exitOK
}
