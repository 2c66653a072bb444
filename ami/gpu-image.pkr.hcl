# scDINO GPU image: the official AWS ParallelCluster AMI of the pinned version, plus the one Python
# environment of the cluster (/opt/scdino-venv: requirements.txt and requirements-dali.txt, pinned),
# nccl-tests linked against the NCCL that torch ships, DCGM, and a check of the base image's
# EFA/aws-ofi-nccl stack. The compute queues boot it (docs/deploy.md, "Building the GPU image").
#
# Built by the image stack's CodeBuild project; by hand, from the repository root:
#   packer init ami && packer build -var region=us-east-1 -var subnet_id=subnet-... \
#     -var ssh_source_cidr=$(curl -s https://checkip.amazonaws.com)/32 -var build_tag=scdino ami

variable "region" {
  type        = string
  description = "AWS region to build in"
}

variable "subnet_id" {
  type        = string
  description = "Public subnet the build instance starts in"
}

variable "ssh_source_cidr" {
  type        = string
  description = "Only address allowed to SSH to the build instance: the machine running Packer"
}

variable "build_tag" {
  type        = string
  default     = "scdino"
  description = "Deployment prefix: the image stack's build role may only stop, terminate or delete what carries it"
}

variable "pcluster_version" {
  type        = string
  default     = "3.16.1"
  description = "ParallelCluster version whose official AMI is the base (must match the cluster)"
}

variable "os" {
  type        = string
  default     = "alinux2023"
  description = "ParallelCluster Os name: alinux2023, ubuntu2204 or rhel9 (stacks/settings.py SUPPORTED_OSES)"
}

variable "instance_type" {
  type        = string
  default     = "g4dn.xlarge"
  description = "Build instance: needs an NVIDIA GPU so that the driver check can run"
}

variable "volume_size_gib" {
  type    = number
  default = 100
}

variable "nccl_tests_version" {
  type    = string
  default = "v2.16.9"
}

locals {
  # Name fragments of the official ParallelCluster AMIs, each OS's login user and root device.
  ami_os_names = {
    alinux2023 = "amzn2023-hvm"
    ubuntu2204 = "ubuntu-2204-lts-hvm"
    rhel9      = "rhel9-hvm"
  }
  ssh_users = {
    alinux2023 = "ec2-user"
    ubuntu2204 = "ubuntu"
    rhel9      = "ec2-user"
  }
  root_devices = {
    alinux2023 = "/dev/xvda"
    ubuntu2204 = "/dev/sda1"
    rhel9      = "/dev/sda1"
  }
  build_tags = {
    "scdino:image-build" = var.build_tag
  }
  timestamp = formatdate("YYYYMMDDhhmm", timestamp())
}

source "amazon-ebs" "gpu" {
  region                                = var.region
  instance_type                         = var.instance_type
  subnet_id                             = var.subnet_id
  associate_public_ip_address           = true
  temporary_security_group_source_cidrs = [var.ssh_source_cidr]
  ssh_username                          = local.ssh_users[var.os]
  ami_name                              = "scdino-gpu-${var.os}-pcluster-${var.pcluster_version}-${local.timestamp}"
  ami_description                       = "scDINO GPU image on ParallelCluster ${var.pcluster_version} (${var.os})"
  run_tags                              = local.build_tags
  snapshot_tags                         = local.build_tags

  source_ami_filter {
    filters = {
      name                = "aws-parallelcluster-${var.pcluster_version}-${local.ami_os_names[var.os]}-x86_64*"
      virtualization-type = "hvm"
      architecture        = "x86_64"
    }
    owners      = ["amazon"]
    most_recent = true
  }

  # Encrypted at launch, so the AMI's snapshot is encrypted without a copy of the image.
  launch_block_device_mappings {
    device_name           = local.root_devices[var.os]
    encrypted             = true
    volume_size           = var.volume_size_gib
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 125
    delete_on_termination = true
  }

  # ParallelCluster's CustomAmiTagValidator rejects an AMI with a version tag but no build status.
  tags = merge(local.build_tags, {
    Name                           = "scdino-gpu-${var.os}"
    "parallelcluster:version"      = var.pcluster_version
    "parallelcluster:build_status" = "available"
    "parallelcluster:os"           = var.os
    "scdino:base-ami"              = "{{ .SourceAMI }}"
    "scdino:base-ami-name"         = "{{ .SourceAMIName }}"
  })
}

build {
  sources = ["source.amazon-ebs.gpu"]

  # The pinned requirements the node environment is built from (the repository root's files).
  provisioner "file" {
    sources     = ["${path.root}/../requirements.txt", "${path.root}/../requirements-dali.txt"]
    destination = "/tmp/"
  }

  provisioner "shell" {
    execute_command = "sudo -E bash '{{ .Path }}'"
    environment_vars = [
      "NCCL_TESTS_VERSION=${var.nccl_tests_version}",
      "REQUIREMENTS_DIR=/tmp",
    ]
    scripts = [
      "${path.root}/scripts/00-check-gpu-driver.sh",
      "${path.root}/scripts/10-check-efa.sh",
      "${path.root}/scripts/20-python-env.sh",
      "${path.root}/scripts/30-nccl-tests.sh",
      "${path.root}/scripts/40-dcgm.sh",
      "${path.root}/scripts/90-cleanup.sh",
    ]
  }

  post-processor "manifest" {
    output     = "packer-manifest.json"
    strip_path = true
  }
}
