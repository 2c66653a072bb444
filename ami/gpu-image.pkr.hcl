# scDINO GPU images, one build per cluster back end (the image stack's CodeBuild project runs one with
# -only, as `backend` chooses):
#   parallelcluster.amazon-ebs.gpu  the official AWS ParallelCluster AMI of the pinned version, plus the
#       cluster's one Python environment (/opt/scdino-venv: requirements.txt and requirements-dali.txt,
#       pinned), nccl-tests linked against the NCCL that torch ships, DCGM, and a check of the base
#       image's EFA/aws-ofi-nccl stack. The compute queues boot it.
#   pcs.amazon-ebs.pcs  AWS's Deep Learning Base GPU AMI (NVIDIA driver, CUDA, EFA, aws-ofi-nccl) plus what
#       a PCS node needs (the Lustre client, the CloudWatch agent, the AWS PCS agent and PCS's Slurm from
#       AWS's signed installers) and the same environment, nccl-tests and checks. Every PCS node boots it.
# (docs/deploy.md, "Building the GPU image").
#
# Built by the image stack's CodeBuild project; by hand, from the repository root:
#   packer init ami && packer build -only=parallelcluster.amazon-ebs.gpu -var region=us-east-1 \
#     -var subnet_id=subnet-... -var ssh_source_cidr=$(curl -s https://checkip.amazonaws.com)/32 -var build_tag=scdino ami

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

variable "pcs_slurm_version" {
  type        = string
  default     = "25.11"
  description = "Slurm major version the PCS cluster runs (stacks/settings.py PCS_SLURM_VERSION)"
}

variable "pcs_agent_installer" {
  type        = string
  default     = "latest"
  description = "AWS PCS agent installer release (e.g. 1.3.1-1), or latest; its signature is checked either way"
}

variable "pcs_slurm_installer" {
  type        = string
  default     = "latest"
  description = "AWS PCS Slurm installer release (e.g. 25.11.2-1), or latest; its signature is checked either way"
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
  # AWS's Deep Learning Base AMIs (open-source NVIDIA driver): the PCS image's base, per OS.
  dlami_names = {
    alinux2023 = "Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *"
    ubuntu2204 = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"
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

source "amazon-ebs" "pcs" {
  region                                = var.region
  instance_type                         = var.instance_type
  subnet_id                             = var.subnet_id
  associate_public_ip_address           = true
  temporary_security_group_source_cidrs = [var.ssh_source_cidr]
  ssh_username                          = local.ssh_users[var.os]
  ami_name                              = "scdino-gpu-${var.os}-pcs-slurm-${var.pcs_slurm_version}-${local.timestamp}"
  ami_description                       = "scDINO GPU image for AWS PCS, Slurm ${var.pcs_slurm_version} (${var.os})"
  run_tags                              = local.build_tags
  snapshot_tags                         = local.build_tags

  source_ami_filter {
    filters = {
      name                = lookup(local.dlami_names, var.os, "no Deep Learning Base AMI for ${var.os}")
      virtualization-type = "hvm"
      architecture        = "x86_64"
    }
    owners      = ["amazon"]
    most_recent = true
  }

  launch_block_device_mappings {
    device_name           = local.root_devices[var.os]
    encrypted             = true
    volume_size           = var.volume_size_gib
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 125
    delete_on_termination = true
  }

  tags = merge(local.build_tags, {
    Name                   = "scdino-gpu-pcs-${var.os}"
    "scdino:pcs-slurm"     = var.pcs_slurm_version
    "scdino:base-ami"      = "{{ .SourceAMI }}"
    "scdino:base-ami-name" = "{{ .SourceAMIName }}"
  })
}

build {
  name    = "parallelcluster"
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

build {
  name    = "pcs"
  sources = ["source.amazon-ebs.pcs"]

  provisioner "file" {
    sources     = ["${path.root}/../requirements.txt", "${path.root}/../requirements-dali.txt"]
    destination = "/tmp/"
  }

  provisioner "shell" {
    execute_command = "sudo -E bash '{{ .Path }}'"
    environment_vars = [
      "NCCL_TESTS_VERSION=${var.nccl_tests_version}",
      "REQUIREMENTS_DIR=/tmp",
      "AWS_REGION=${var.region}",
      "PCS_SLURM_VERSION=${var.pcs_slurm_version}",
      "PCS_AGENT_INSTALLER=${var.pcs_agent_installer}",
      "PCS_SLURM_INSTALLER=${var.pcs_slurm_installer}",
    ]
    scripts = [
      "${path.root}/scripts/00-check-gpu-driver.sh",
      "${path.root}/scripts/10-check-efa.sh",
      "${path.root}/scripts/15-pcs-node.sh",
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
