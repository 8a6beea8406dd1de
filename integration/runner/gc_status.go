//go:build libcni13

package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// gc runs libcni's GC of the network: DEL for every cached attachment not in
// valid, then the GC verb (spec 1.1.0) with the list, as a runtime does after
// a restart. An empty valid means no attachment is valid.
func gc(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList, valid string) error {
	attachments := []types.GCAttachment{}
	if valid != "" {
		if err := json.Unmarshal([]byte(valid), &attachments); err != nil {
			return fmt.Errorf("invalid --valid-attachments (need a JSON list of {\"containerID\",\"ifname\"}): %w", err)
		}
	}
	return cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: attachments})
}

// status runs libcni's STATUS of the network (spec 1.1.0).
func status(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList) error {
	return cni.GetStatusNetworkList(ctx, list)
}
