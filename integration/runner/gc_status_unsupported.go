//go:build !libcni13

package main

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/libcni"
)

var errNoGC = errors.New("gc and status need libcni >= 1.2 (this cnirunner is built on Debian's libcni 1.1.2; build.sh --libcni13 builds the other)")

func gc(_ context.Context, _ *libcni.CNIConfig, _ *libcni.NetworkConfigList, _ string) error {
	return errNoGC
}

func status(_ context.Context, _ *libcni.CNIConfig, _ *libcni.NetworkConfigList) error {
	return errNoGC
}
