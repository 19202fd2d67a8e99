#!/bin/sh
# The package VM's first program (rdinit). The first boot runs systemd
# from the initramfs, a fresh rootfs. The adopt step copies that root,
# as it is then, to the VM's disk (/dev/vda) and reboots: a boot that finds
# the copy switches to it, so the node boots from the state it had, as a
# node with a disk does.
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
for m in virtio_pci virtio_blk ext4; do modprobe "$m" 2>/dev/null; done
i=0
while [ ! -b /dev/vda ] && [ "$i" -lt 50 ]; do
	sleep 0.1
	i=$((i + 1))
done
mkdir -p /sysroot
if [ -b /dev/vda ] && mount -t ext4 /dev/vda /sysroot 2>/dev/null; then
	if [ -e /sysroot/.vm-root ]; then
		echo "rdinit: booting the root saved on /dev/vda" > /dev/ttyS0
		exec switch_root /sysroot /lib/systemd/systemd
	fi
	umount /sysroot
fi
exec /lib/systemd/systemd
