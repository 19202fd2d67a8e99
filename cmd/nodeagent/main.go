// Command nodeagent converges a node's VLAN, routing, nftables and
// WireGuard plumbing from /etc/nodeagent/nodeagent.yaml. It only parses
// flags; the work is in package agent.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/logging"
	"github.com/nodeagent/nodeagent/agent/offline"
	"github.com/nodeagent/nodeagent/agent/release"
	"github.com/nodeagent/nodeagent/cmd/internal/cliflags"
	"github.com/nodeagent/nodeagent/cmd/nodeagent/internal/earlyhup"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

var version = "dev" // set with -ldflags "-X main.version=..."

// DefaultConfig is where the packaged config lives.
const DefaultConfig = "/etc/nodeagent/nodeagent.yaml"

const usage = `nodeagent converges a node's trunk, VLAN and VPN plumbing from one YAML file.

Usage:
  nodeagent run [-c FILE]            the daemon: converge, then keep the node converged (config and
                                     peersDir changes, SIGHUP, kernel events, a resync every 30s),
                                     serving status on the local API socket
  nodeagent validate [-c FILE]       check the config and read every file it names as the daemon
                                     will; exit 1 with every error as file:line: field: reason
  nodeagent validate --offline [-c FILE]
                                     check the config alone (schema, semantics, cross-references)
                                     reading no file it names (keys, credentials, peersDir, the
                                     port hook) nor the state directory: for a config checked in
                                     a repository's CI, away from the node
  nodeagent plan [-c FILE]           print what would change (+ add, ~ change, - remove, ! cannot);
                                     writes nothing and needs no root
  nodeagent regions [-c FILE]        list the cached PIA server list's region ids, port forwarding marked
  nodeagent apply --once [-c FILE]   converge once; exit 1 naming every object that failed
  nodeagent teardown [--force]       remove exactly what nodeagent owns (marked links and addresses,
                                     its nftables tables, rules, routes, WireGuard devices) and
                                     forget the PIA registrations of the devices it removed;
                                     refused, changing nothing, while pods' links sit on a link
                                     it would delete (--force deletes them with it)
  nodeagent import --out DIR         write a config that adopts what this node has (VLANs, wg-quick, rules;
                                     nodeagent import --help for more)
  nodeagent release [-c FILE] [--dry-run] [--in-place] [--force]
                                     the way back after an adoption: hand what the config adopts
                                     (adopt: true) back to the old setup, unmarked and running, and
                                     remove what nodeagent made, as teardown does; what wg-quick or a
                                     unit running ip ... add makes itself is deleted for it to make
                                     again (--in-place: kept, for it to make at the next boot).
                                     Prints each object, then the steps that start the old setup
                                     again; refused, changing nothing, while pods' links sit on a link
                                     it would delete (--force deletes them with it)
  nodeagent version                  print the version (also --version)
  nodeagent help                     this help (also -h, --help)

The commands take no arguments: the config is always named with -c FILE
(nodeagent validate -c ./nodeagent.yaml), never as a bare argument.

Flags:
  -c, --config FILE   config file (default %s; env NODEAGENT_CONFIG)
      --rt-tables FILE
                      where the routing tables' names are written for ip(8)
                      (default /etc/iproute2/rt_tables.d/nodeagent.conf;
                      env NODEAGENT_RT_TABLES; "" to write none)
      --state-dir DIR where run keeps state: PIA registrations, keys and the
                      cached server list, under DIR/pia (default /var/lib/nodeagent;
                      env NODEAGENT_STATE_DIR); plan and validate read it
      --once          with apply: converge once and exit
      --offline       with validate: check the config alone, reading no file it names
      --force         with teardown and release: delete links that other
                      namespaces' links (pods attached by a CNI plugin) sit on;
                      the kernel deletes those with them
      --dry-run       with release: print what it would do and the steps after,
                      and change nothing
      --in-place      with release: delete nothing adopted; what wg-quick or a
                      unit makes itself is handed back as it is, and the unit
                      makes it at the next boot
      --etc DIR       with release: read the old setup's files (/etc/wireguard,
                      /etc/systemd/system, /etc/systemd/network, /etc/netplan,
                      /etc/network/interfaces, /etc/NetworkManager, the
                      rt_tables files) from DIR instead (default /etc)
      --lock FILE     the lock that run, apply --once, teardown and release hold,
                      so that two never change the node at once (default %s;
                      env NODEAGENT_LOCK; "" for none); refused while the
                      daemon holds it: systemctl stop nodeagent first
      --socket PATH   with run: the local API socket (default %s;
                      env NODEAGENT_SOCKET; "" for none)
      --metrics ADDR  with run: serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9477;
                      env NODEAGENT_METRICS; default off; an ADDR not yet on the node
                      is waited for, not an error), and the forwarded port as
                      gluetun's control server does (GET /v1/portforward and
                      /v1/openvpn/portforwarded: {"port":N,"ports":[N]})
      --metrics-api-key-file FILE
                      with run: the forwarded port's endpoints ask for the key in FILE
                      (one line; root's, mode 0600) as X-API-Key or Authorization:
                      Bearer (env NODEAGENT_METRICS_API_KEY_FILE; default none)
      --resync DUR    with run: full resync period (default 30s)
      --log-level LVL debug (full plans), info (changes, at most 20 of a kind
                      listed per sync, the rest counted; default), warn or error;
                      env NODEAGENT_LOG_LEVEL
      --version       print the version
  -h, --help          this help

SIGINT or SIGTERM stops any command: run stops cleanly, leaving the node as
it is; the others stop at the next step, and exit 130 if they have not within
5 seconds (a second signal exits at once).

Exit status: 0 success, 1 failure or invalid config, 2 usage error,
130 interrupted.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "import" {
		// import has flags of its own (--out, --only, ...), which the
		// other commands' flag set would refuse.
		return runImport(args[1:], stdout, stderr)
	}
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringP("config", "c", DefaultConfig, "config file")
	fs.String("rt-tables", netcfg.DefaultTablesFile, "rt_tables.d entry")
	fs.String("state-dir", pia.DefaultStateDir, "state directory")
	once := fs.Bool("once", false, "converge once and exit")
	offlineFlag := fs.Bool("offline", false, "validate: read no file the config names")
	force := fs.Bool("force", false, "teardown, release: delete links pods sit on")
	dryRun := fs.Bool("dry-run", false, "release: print, change nothing")
	inPlace := fs.Bool("in-place", false, "release: delete nothing adopted")
	etc := fs.String("etc", "/etc", "release: directory standing for /etc")
	fs.String("lock", agent.DefaultLock, "lock file")
	fs.String("socket", api.DefaultSocket, "local API socket")
	fs.String("metrics", "", "metrics listen address")
	fs.String("metrics-api-key-file", "", "the port endpoints' API key file")
	resync := fs.Duration("resync", agent.DefaultResync, "resync period")
	fs.String("log-level", "info", "log level")
	help := fs.BoolP("help", "h", false, "help")
	showVersion := fs.Bool("version", false, "print the version")
	if err := cliflags.SingleDashLong(fs, args); err != nil {
		fmt.Fprintf(stderr, "nodeagent: %v\n", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "nodeagent: %v\n\n", err)
		fmt.Fprintf(stderr, usage, DefaultConfig, agent.DefaultLock, api.DefaultSocket)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "nodeagent", version)
		return 0
	}
	v := viper.New()
	v.SetEnvPrefix("NODEAGENT")
	v.AutomaticEnv()
	v.BindPFlag("config", fs.Lookup("config"))
	v.BindPFlag("rt_tables", fs.Lookup("rt-tables"))
	v.BindPFlag("state_dir", fs.Lookup("state-dir"))
	v.BindPFlag("socket", fs.Lookup("socket"))
	v.BindPFlag("metrics", fs.Lookup("metrics"))
	v.BindPFlag("metrics_api_key_file", fs.Lookup("metrics-api-key-file"))
	v.BindPFlag("log_level", fs.Lookup("log-level"))
	v.BindPFlag("lock", fs.Lookup("lock"))
	opts := agent.Options{Config: v.GetString("config"), TablesFile: v.GetString("rt_tables"), StateDir: v.GetString("state_dir")}

	if *help || fs.NArg() == 0 || fs.Arg(0) == "help" {
		fmt.Fprintf(stdout, usage, DefaultConfig, agent.DefaultLock, api.DefaultSocket)
		if fs.NArg() == 0 && !*help {
			return 2
		}
		return 0
	}
	if fs.NArg() > 1 {
		// A stray word would otherwise be ignored, and validate or plan
		// would judge the default config instead of the file meant.
		cmd, extra := fs.Arg(0), fs.Args()[1:]
		fmt.Fprintf(stderr, "nodeagent: %s takes no arguments, got %q", cmd, extra)
		if len(extra) == 1 && !fs.Changed("config") {
			fmt.Fprintf(stderr, "; to use %s as the config: nodeagent %s -c %s", extra[0], cmd, extra[0])
		}
		fmt.Fprintln(stderr)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(v.GetString("log_level"))); err != nil {
		fmt.Fprintf(stderr, "nodeagent: --log-level: %v\n", err)
		return 2
	}
	log := logging.New(stderr, level)

	cmd := fs.Arg(0)
	if *offlineFlag && cmd != "validate" {
		fmt.Fprintf(stderr, "nodeagent: --offline is for validate, not %s\n", cmd)
		return 2
	}
	var work func(ctx context.Context) error
	which := cmd
	if *offlineFlag {
		which = "validate-offline"
	}
	switch which {
	case "run":
		logging.RouteKlog(log)
		work = func(ctx context.Context) error {
			o := agent.RunOptions{
				Options: opts, Socket: v.GetString("socket"), MetricsAddr: v.GetString("metrics"), MetricsAPIKeyFile: v.GetString("metrics_api_key_file"),
				Resync: *resync, Version: version, TestHooks: os.Getenv("NODEAGENT_TEST_HOOKS") == "1",
				Reload: earlyhup.Channel(),
			}
			if o.TestHooks {
				o.PIATimers.Now = testClock()
			}
			return runDaemon(ctx, log, o)
		}
	case "validate-offline":
		work = func(context.Context) error { return offline.Validate(stdout, opts.Config) }
	case "validate":
		work = func(context.Context) error { return agent.Validate(stdout, opts) }
	case "plan":
		work = func(ctx context.Context) error { return agent.Plan(ctx, stdout, opts) }
	case "regions":
		work = func(context.Context) error { return agent.Regions(stdout, opts) }
	case "apply":
		if !*once {
			fmt.Fprintln(stderr, "nodeagent: apply needs --once (the long-running daemon is nodeagent run)")
			return 2
		}
		work = func(ctx context.Context) error { return agent.ApplyOnce(ctx, stdout, log, opts) }
	case "teardown":
		opts.Force = *force
		opts.PortDir = filepath.Join(filepath.Dir(v.GetString("socket")), "pia")
		work = func(ctx context.Context) error { return agent.Teardown(ctx, stdout, log, opts) }
	case "release":
		opts.PortDir = filepath.Join(filepath.Dir(v.GetString("socket")), "pia")
		work = func(ctx context.Context) error {
			c, d, err := agent.Load(opts)
			if err != nil {
				return err
			}
			var piaDevs []string
			for _, w := range c.WireGuard {
				if w.PIA != nil {
					piaDevs = append(piaDevs, w.Name)
				}
			}
			return release.Run(ctx, stdout, release.Config{
				Desired: d, Etc: *etc, TablesFile: opts.TablesFile, StateDir: cmp.Or(opts.StateDir, pia.DefaultStateDir), PortDir: opts.PortDir,
				Options: release.Options{InPlace: *inPlace, PIA: piaDevs}, Force: *force, DryRun: *dryRun, Log: log,
			})
		}
	case "version":
		fmt.Fprintln(stdout, "nodeagent", version)
		return 0
	default:
		fmt.Fprintf(stderr, "nodeagent: unknown command %q\n\n", cmd)
		fmt.Fprintf(stderr, usage, DefaultConfig, agent.DefaultLock, api.DefaultSocket)
		return 2
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"dry-run", *dryRun}, {"in-place", *inPlace}, {"etc", fs.Changed("etc")}} {
		if f.set && cmd != "release" {
			fmt.Fprintf(stderr, "nodeagent: --%s is for release only\n", f.name)
			return 2
		}
	}
	if cmd == "run" || cmd == "apply" || cmd == "teardown" || cmd == "release" {
		if path := v.GetString("lock"); path != "" {
			what := cmd
			if cmd == "apply" {
				what = "apply --once"
			}
			unlock, err := agent.Lock(path, what)
			switch {
			case err != nil && cmd == "release" && *dryRun:
				// A dry run changes nothing: it may look while the daemon
				// runs, and says that release itself would be refused.
				fmt.Fprintf(stderr, "nodeagent: note: %v\n", err)
			case err != nil:
				fmt.Fprintf(stderr, "nodeagent: %v\n", err)
				return 1
			default:
				defer unlock()
			}
		}
	}
	interrupted, err := runInterruptible(work, cmd == "run", stderr)
	if interrupted {
		return 130
	}
	if err != nil {
		var invalid *agent.InvalidError
		var offlineInvalid *offline.InvalidError
		if errors.As(err, &invalid) || errors.As(err, &offlineInvalid) {
			fmt.Fprintln(stderr, err)
		} else {
			fmt.Fprintf(stderr, "nodeagent: %v\n", err)
		}
		return 1
	}
	return 0
}

// interruptGrace is how long a one-shot command has to stop after SIGINT
// or SIGTERM cancelled its context.
const interruptGrace = 5 * time.Second

// runInterruptible runs work with a context that SIGINT and SIGTERM
// cancel. The daemon stops cleanly on its own; a one-shot command that has
// not returned interruptGrace after the signal (or at a second signal) is
// reported as interrupted, and the caller exits.
func runInterruptible(work func(context.Context) error, daemon bool, stderr io.Writer) (interrupted bool, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	done := make(chan error, 1)
	go func() { done <- work(ctx) }()
	var grace <-chan time.Time
	for {
		select {
		case err := <-done:
			return false, err
		case s := <-sig:
			if ctx.Err() != nil {
				fmt.Fprintf(stderr, "nodeagent: %v again; stopping now\n", s)
				return true, nil
			}
			cancel()
			if !daemon {
				grace = time.After(interruptGrace)
			}
		case <-grace:
			fmt.Fprintln(stderr, "nodeagent: interrupted; the command did not stop within", interruptGrace)
			return true, nil
		}
	}
}

// daemonGCPercent is the daemon's garbage collector target unless GOGC
// says otherwise: it allocates little once converged, so a heap that
// grows to half again its live size rather than double keeps its memory
// down (5000 peers: about 25 MiB of heap rather than 34) for a collection
// or so a minute more.
const daemonGCPercent = 50

func runDaemon(ctx context.Context, log *slog.Logger, o agent.RunOptions) error {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(daemonGCPercent)
		tuneGC()
	}
	o.Log = log
	d, err := agent.NewDaemon(o)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
