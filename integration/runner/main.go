// cnirunner drives libcni for the integration tests where upstream cnitool
// cannot: a container ID of the test's choosing (cnitool hashes the netns
// path), a DEL without a netns, the CNI error's code (cnitool prints only its
// message) and a GC with a valid-attachments list (cnitool sends none). It
// uses the real libcni, so plugins are exercised the way a runtime drives
// them: conflist loading, prevResult chaining, the result cache, CHECK/DEL
// with the cached result and runtimeConfig capability injection.
//
// Built twice by build.sh: on Debian's libcni 1.1.2 (GOPATH mode; add, check,
// del) and on the libcni go.mod pins (module mode, build tag libcni13; also
// gc and status, spec 1.1.0).
//
// Usage:
//
//	cnirunner <add|check|del> --conf-dir DIR --name NETNAME --netns PATH
//	(del: --netns "" for a sandbox already gone)
//	          --container-id ID [--ifname eth0] --cni-path DIR[:DIR]
//	          [--cache-dir DIR] [--args 'K=V;K2=V2'] [--capability-args JSON]
//	cnirunner gc --conf-dir DIR --name NETNAME --cni-path DIR[:DIR]
//	          [--cache-dir DIR] [--valid-attachments '[{"containerID":..,"ifname":..}]']
//	cnirunner status --conf-dir DIR --name NETNAME --cni-path DIR[:DIR]
//
// Exit status: 0 on success (ADD prints the result JSON on stdout), 2 when the
// failure is a CNI error (last stderr line is "CNI_ERROR {json}"), 1 for any
// other failure (including usage errors).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

const usage = `usage: cnirunner <add|check|del> --conf-dir DIR --name NETNAME --netns PATH --container-id ID [--ifname eth0] --cni-path DIR[:DIR] [--cache-dir DIR] [--args 'K=V;K2=V2'] [--capability-args JSON-object]
       cnirunner gc --conf-dir DIR --name NETNAME --cni-path DIR[:DIR] [--cache-dir DIR] [--valid-attachments JSON-array]
       cnirunner status --conf-dir DIR --name NETNAME --cni-path DIR[:DIR]`

type options struct {
	verb           string
	confDir        string
	name           string
	netns          string
	containerID    string
	ifName         string
	cniPath        string
	cacheDir       string
	args           string
	capabilityArgs string
	// gc: the JSON list of {"containerID","ifname"} still valid (absent: none).
	validAttachments string
}

func parseOptions(argv []string) (*options, error) {
	if len(argv) < 1 {
		return nil, errors.New("missing verb")
	}
	o := &options{verb: strings.ToLower(argv[0])}
	switch o.verb {
	case "add", "check", "del", "gc", "status":
	default:
		return nil, fmt.Errorf("unknown verb %q", argv[0])
	}

	fs := flag.NewFlagSet("cnirunner", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.StringVar(&o.confDir, "conf-dir", "", "directory holding *.conflist files")
	fs.StringVar(&o.name, "name", "", "network name (conflist \"name\")")
	fs.StringVar(&o.netns, "netns", "", "path of the container network namespace")
	fs.StringVar(&o.containerID, "container-id", "", "container ID")
	fs.StringVar(&o.ifName, "ifname", "eth0", "interface name inside the container")
	fs.StringVar(&o.cniPath, "cni-path", "", "plugin search path, ':'-separated")
	fs.StringVar(&o.cacheDir, "cache-dir", "", "libcni cache directory (default /var/lib/cni)")
	fs.StringVar(&o.args, "args", "", "CNI_ARGS as 'K=V;K2=V2'")
	fs.StringVar(&o.capabilityArgs, "capability-args", "", "capability args as a JSON object")
	fs.StringVar(&o.validAttachments, "valid-attachments", "", "gc: JSON list of {\"containerID\",\"ifname\"} still valid")
	if err := fs.Parse(argv[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}

	required := []struct{ flag, value string }{
		{"--conf-dir", o.confDir},
		{"--name", o.name},
		{"--cni-path", o.cniPath},
	}
	// GC and STATUS concern the whole network, not one attachment.
	if o.verb != "gc" && o.verb != "status" {
		required = append(required, []struct{ flag, value string }{
			{"--netns", o.netns},
			{"--container-id", o.containerID},
		}...)
	}
	missing := []string{}
	for _, req := range required {
		// A runtime's DEL after the sandbox is gone has no netns (the spec
		// allows it; a delegating plugin such as Multus passes it on).
		if req.flag == "--netns" && o.verb == "del" && explicitlyEmpty(fs, "netns") {
			continue
		}
		if req.value == "" {
			missing = append(missing, req.flag)
		}
	}
	if len(missing) != 0 {
		return nil, fmt.Errorf("missing required flags: %s", strings.Join(missing, " "))
	}
	return o, nil
}

// explicitlyEmpty reports whether the flag was given, with an empty value.
func explicitlyEmpty(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			given = true
		}
	})
	return given
}

// parseArgs turns "K=V;K2=V2" into libcni's [][2]string. Empty segments are
// ignored; a segment without '=' is an error.
func parseArgs(s string) ([][2]string, error) {
	var out [][2]string
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		parts := strings.SplitN(kv, "=", 2)
		if len(parts) != 2 || parts[0] == "" {
			return nil, fmt.Errorf("invalid --args element %q: expected K=V", kv)
		}
		out = append(out, [2]string{parts[0], parts[1]})
	}
	return out, nil
}

func splitPath(s string) []string {
	var out []string
	for _, p := range filepath.SplitList(s) {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(o *options) error {
	list, err := libcni.LoadConfList(o.confDir, o.name)
	if err != nil {
		return fmt.Errorf("loading network %q from %s: %w", o.name, o.confDir, err)
	}

	args, err := parseArgs(o.args)
	if err != nil {
		return err
	}

	var capArgs map[string]interface{}
	if o.capabilityArgs != "" {
		if err := json.Unmarshal([]byte(o.capabilityArgs), &capArgs); err != nil {
			return fmt.Errorf("invalid --capability-args (need a JSON object): %w", err)
		}
	}

	rt := &libcni.RuntimeConf{
		ContainerID:    o.containerID,
		NetNS:          o.netns,
		IfName:         o.ifName,
		Args:           args,
		CapabilityArgs: capArgs,
	}

	cni := libcni.NewCNIConfigWithCacheDir(splitPath(o.cniPath), o.cacheDir, nil)
	ctx := context.Background()

	switch o.verb {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		data, err := json.Marshal(result)
		if err != nil {
			return fmt.Errorf("encoding result: %w", err)
		}
		if _, err := fmt.Fprintln(os.Stdout, string(data)); err != nil {
			return fmt.Errorf("writing result: %w", err)
		}
		return nil
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	case "gc":
		return gc(ctx, cni, list, o.validAttachments)
	case "status":
		return status(ctx, cni, list)
	}
	return fmt.Errorf("unknown verb %q", o.verb)
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "cnirunner: %v\n%s\n", err, usage)
		os.Exit(1)
	}

	err = run(o)
	if err == nil {
		os.Exit(0)
	}

	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		data, merr := json.Marshal(cniErr)
		if merr == nil {
			// json.Marshal never emits raw newlines, so this is one line.
			fmt.Fprintf(os.Stderr, "CNI_ERROR %s\n", data)
			os.Exit(2)
		}
	}
	fmt.Fprintf(os.Stderr, "cnirunner: %v\n", err)
	os.Exit(1)
}
