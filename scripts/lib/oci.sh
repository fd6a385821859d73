# shellcheck shell=bash
# oci.sh — sourced by scripts/cri-lab.sh and scripts/image.sh: an OCI image
# archive from a directory, with umoci alone (no registry, no Docker daemon).
#
# oci_archive WORK ROOTFS TAG TAR [umoci config args...]
#   A single-layer image of ROOTFS's contents (owners and modes kept: run as
#   root, or they become the caller's), tagged TAG, configured by the umoci
#   config args (--config.entrypoint, --config.label, ...), written to TAR as
#   an OCI image layout in a tar (oci-layout, index.json, blobs/), the form
#   `ctr images import`, `podman load` and `skopeo copy oci-archive:` take.
#   WORK is scratch space, removed before and after. The tar is written
#   next to TAR first and renamed, so a reader never sees half of one.
oci_archive() {
  local work=$1 rootfs=$2 tag=$3 tar=$4
  shift 4
  rm -rf "$work"
  mkdir -p "$work"
  umoci init --layout "$work/oci"
  umoci new --image "$work/oci:$tag"
  umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
  cp -a "$rootfs/." "$work/bundle/rootfs/"
  umoci repack --image "$work/oci:$tag" "$work/bundle"
  umoci config --image "$work/oci:$tag" "$@"
  # config writes a new manifest; the ones before it are garbage.
  umoci gc --layout "$work/oci"
  tar -C "$work/oci" -cf "$tar.tmp" oci-layout index.json blobs
  mv "$tar.tmp" "$tar"
  rm -rf "$work"
}
