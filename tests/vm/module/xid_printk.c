// SPDX-License-Identifier: GPL-2.0
/*
 * Test module for gpuwatchd's VM test: puts a line into the kernel log exactly as a
 * kernel driver does, so that it reaches the journal with _TRANSPORT=kernel and
 * SYSLOG_FACILITY=0 like the NVIDIA driver's "NVRM: Xid (PCI:...): 79, ..." reports.
 *
 *   insmod xid_printk.ko
 *   printf '%s' 'NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.' \
 *       > /sys/module/xid_printk/parameters/line
 *
 * Each write to the root-only parameter file logs one line at KERN_ERR. Never load it on a
 * machine whose kernel log matters: the lines look like real GPU faults.
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/printk.h>
#include <linux/string.h>

#define XID_PRINTK_MAX 480

static int xid_printk_set(const char *val, const struct kernel_param *kp)
{
	size_t len = strnlen(val, XID_PRINTK_MAX + 1);

	if (len == 0 || len > XID_PRINTK_MAX)
		return -EINVAL;
	if (val[len - 1] == '\n')
		len--;
	printk(KERN_ERR "%.*s\n", (int)len, val);
	return 0;
}

static const struct kernel_param_ops xid_printk_ops = {
	.set = xid_printk_set,
	.get = NULL,
};

module_param_cb(line, &xid_printk_ops, NULL, 0200);
MODULE_PARM_DESC(line, "a line to write to the kernel log, as a driver would");

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gpuwatchd VM test: printk a given line");
