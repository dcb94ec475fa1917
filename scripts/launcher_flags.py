"""The flags of scripts/tpu_vm.py, the Cloud TPU VM launcher (checked by scripts/gcloud.py flag_problem and
scripts/input_vms.py input_problem before anything runs)."""

import argparse


def parse_args(argv: list[str], description: str) -> argparse.Namespace:
    """The launcher's flags; `description` is its --help text (scripts/tpu_vm.py's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--name", required=True, help="TPU VM name (lowercase letters, digits, hyphens)")
    add("--zone", required=True, help="e.g. us-central1-b (the bucket should be in its region)")
    add("--accelerator_type", required=True, help="e.g. v4-8, v5litepod-8, v5p-8, v6e-8, v3-32")
    add("--version", required=True, help="TPU software version, e.g. tpu-vm-tf-2.x.y[-pod][-pjrt], v2-alpha-tpuv6e")
    add("--project", default=None, help="GCP project (default: gcloud's)")
    add("--spot", action="store_true", help="spot capacity (cheaper, can be preempted)")
    add("--queued", action="store_true", help="create through queued resources: wait for capacity in Google's queue")
    add("--queue_poll_seconds", type=float, default=30, help="how often to check a queued resource")
    add("--queue_timeout_minutes", type=float, default=24 * 60, help="give up waiting in the queue (0 = never)")
    add("--capacity_retries", type=int, default=5, help="retries of a create that found no capacity")
    add("--retry_seconds", type=float, default=60, help="first wait after a capacity error (doubles each time)")
    add("--max_restarts", type=int, default=0, help="reruns after an interruption or preemption (they resume)")
    add("--poll_seconds", type=float, default=15, help="how often to fetch the job's log")
    add("--ssh_retries", type=int, default=20, help="consecutive failed SSH polls before giving up (TPU kept)")
    add("--stop_timeout", type=float, default=600, help="seconds to wait for the job to stop after Ctrl-C")
    add("--tpu_server_image", default=None, help="pods: TPU server image to run on every host (aligns its TF)")
    add("--input_vms", type=int, default=0, help="CPU VMs to run train.py's tf.data service (DATA_SERVICE) on")
    add("--input_machine_type", default="n2-standard-16", help="the CPU VMs' machine type, e.g. n2-standard-8")
    add("--input_port", type=int, default=5050, help="the tf.data service's port on the CPU VMs")
    add("--include", action="append", default=[], metavar="PATH",
        help="also send this untracked file or folder (repeatable); by default only the files git tracks are sent")
    add("--keep", action="store_true", help="do not delete the TPU at the end")
    add("--skip_create", action="store_true", help="the TPU exists already (still deleted at the end); with "
        "--input_vms, its input VMs too: give the N of the --keep launch that made them")
    add("--dry_run", action="store_true", help="print the gcloud commands, run nothing")
    add("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of train.py")
    args = parser.parse_args(argv)
    args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    return args
