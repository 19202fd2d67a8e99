// Command nodeagent converges a node's VLAN, routing, nftables and
// WireGuard plumbing from /etc/nodeagent/nodeagent.yaml. It only parses
// flags; the work is in package agent.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodeagent/nodeagent/agent"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
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
  nodeagent validate [-c FILE]       check the config; exit 1 with every error as file:line: field: reason
  nodeagent plan [-c FILE]           print what would change (+ add, ~ change, - remove, ! cannot);
                                     writes nothing and needs no root
  nodeagent apply --once [-c FILE]   converge once; exit 1 naming every object that failed
  nodeagent teardown                 remove exactly what nodeagent owns (marked links and addresses)
  nodeagent version                  print the version

Flags:
  -c, --config FILE   config file (default %s; env NODEAGENT_CONFIG)
      --rt-tables FILE
                      where the routing tables' names are written for ip(8)
                      (default /etc/iproute2/rt_tables.d/nodeagent.conf;
                      env NODEAGENT_RT_TABLES; "" to write none)
      --once          with apply: converge once and exit
      --socket PATH   with run: the local API socket (default %s;
                      env NODEAGENT_SOCKET; "" for none)
      --metrics ADDR  with run: serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9477;
                      env NODEAGENT_METRICS; default off)
      --resync DUR    with run: full resync period (default 30s)
      --log-level LVL debug (full plans), info (changes; default), warn or error;
                      env NODEAGENT_LOG_LEVEL
  -h, --help          this help

Exit status: 0 success, 1 failure or invalid config, 2 usage error.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringP("config", "c", DefaultConfig, "config file")
	fs.String("rt-tables", netcfg.DefaultTablesFile, "rt_tables.d entry")
	once := fs.Bool("once", false, "converge once and exit")
	fs.String("socket", api.DefaultSocket, "local API socket")
	fs.String("metrics", "", "metrics listen address")
	resync := fs.Duration("resync", agent.DefaultResync, "resync period")
	fs.String("log-level", "info", "log level")
	help := fs.BoolP("help", "h", false, "help")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "nodeagent: %v\n\n", err)
		fmt.Fprintf(stderr, usage, DefaultConfig, api.DefaultSocket)
		return 2
	}
	v := viper.New()
	v.SetEnvPrefix("NODEAGENT")
	v.AutomaticEnv()
	v.BindPFlag("config", fs.Lookup("config"))
	v.BindPFlag("rt_tables", fs.Lookup("rt-tables"))
	v.BindPFlag("socket", fs.Lookup("socket"))
	v.BindPFlag("metrics", fs.Lookup("metrics"))
	v.BindPFlag("log_level", fs.Lookup("log-level"))
	opts := agent.Options{Config: v.GetString("config"), TablesFile: v.GetString("rt_tables")}

	if *help || fs.NArg() == 0 {
		fmt.Fprintf(stdout, usage, DefaultConfig, api.DefaultSocket)
		if *help {
			return 0
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var level slog.Level
	if err := level.UnmarshalText([]byte(v.GetString("log_level"))); err != nil {
		fmt.Fprintf(stderr, "nodeagent: --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var err error
	switch cmd := fs.Arg(0); cmd {
	case "run":
		err = runDaemon(ctx, log, agent.RunOptions{
			Options: opts, Socket: v.GetString("socket"), MetricsAddr: v.GetString("metrics"),
			Resync: *resync, Version: version, TestHooks: os.Getenv("NODEAGENT_TEST_HOOKS") == "1",
		})
	case "validate":
		err = agent.Validate(stdout, opts)
	case "plan":
		err = agent.Plan(ctx, stdout, opts)
	case "apply":
		if !*once {
			fmt.Fprintln(stderr, "nodeagent: apply needs --once (the long-running daemon is nodeagent run)")
			return 2
		}
		err = agent.ApplyOnce(ctx, stdout, log, opts)
	case "teardown":
		err = agent.Teardown(ctx, stdout, log, opts)
	case "version":
		fmt.Fprintln(stdout, "nodeagent", version)
	default:
		fmt.Fprintf(stderr, "nodeagent: unknown command %q\n\n", cmd)
		fmt.Fprintf(stderr, usage, DefaultConfig, api.DefaultSocket)
		return 2
	}
	if err != nil {
		var invalid *agent.InvalidError
		if errors.As(err, &invalid) {
			fmt.Fprintln(stderr, err)
		} else {
			fmt.Fprintf(stderr, "nodeagent: %v\n", err)
		}
		return 1
	}
	return 0
}

func runDaemon(ctx context.Context, log *slog.Logger, o agent.RunOptions) error {
	o.Log = log
	d, err := agent.NewDaemon(o)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
