# scDINO GPU image: the official AWS ParallelCluster AMI of the pinned version, plus NCCL,
# nccl-tests, DCGM, a checked EFA/aws-ofi-nccl stack and a Python environment with torch,
# torchvision and the DALI build matching the image's CUDA.
#
# Built by the image stack's CodeBuild project (see docs/deploy.md); by hand:
#   packer init . && packer build -var region=us-east-1 -var subnet_id=subnet-... \
#     -var ssh_source_cidr=$(curl -s https://checkip.amazonaws.com)/32 .

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

variable "pcluster_version" {
  type        = string
  default     = "3.16.1"
  description = "ParallelCluster version whose official AMI is the base (must match the cluster)"
}

variable "os" {
  type        = string
  default     = "alinux2023"
  description = "ParallelCluster Os name: alinux2023, ubuntu2204, ubuntu2404, rhel9 or rocky9"
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

variable "efa_installer_version" {
  type    = string
  default = "1.41.0"
}

variable "efa_installer_sha256" {
  type    = string
  default = "3506354cdfbe31ff552fe75f5d0d9bb7efd29cf79bd99457347d29c751c38f9f"
}

variable "nccl_version" {
  type    = string
  default = "v2.27.7-1"
}

variable "nccl_tests_version" {
  type    = string
  default = "v2.16.9"
}

variable "torch_version" {
  type    = string
  default = "2.14.1"
}

variable "torchvision_version" {
  type    = string
  default = "0.29.1"
}

locals {
  # Name fragments of the official ParallelCluster AMIs, and each OS's login user.
  ami_os_names = {
    alinux2023 = "amzn2023-hvm"
    ubuntu2204 = "ubuntu-2204-lts-hvm"
    ubuntu2404 = "ubuntu-2404-lts-hvm"
    rhel9      = "rhel9-hvm"
    rocky9     = "rocky9-hvm"
  }
  ssh_users = {
    alinux2023 = "ec2-user"
    ubuntu2204 = "ubuntu"
    ubuntu2404 = "ubuntu"
    rhel9      = "ec2-user"
    rocky9     = "rocky"
  }
  timestamp = formatdate("YYYYMMDDhhmm", timestamp())
}

source "amazon-ebs" "gpu" {
  region                                = var.region
  instance_type                         = var.instance_type
  subnet_id                             = var.subnet_id
  associate_public_ip_address           = true
  temporary_security_group_source_cidrs = [var.ssh_source_cidr]
  ssh_username                          = lookup(local.ssh_users, var.os, "ec2-user")
  ami_name                              = "scdino-gpu-${var.os}-pcluster-${var.pcluster_version}-${local.timestamp}"
  ami_description                       = "scDINO GPU image on ParallelCluster ${var.pcluster_version} (${var.os})"
  encrypt_boot                          = true

  source_ami_filter {
    filters = {
      name                = "aws-parallelcluster-${var.pcluster_version}-${lookup(local.ami_os_names, var.os, "amzn2023-hvm")}-x86_64*"
      virtualization-type = "hvm"
      architecture        = "x86_64"
    }
    owners      = ["amazon"]
    most_recent = true
  }

  launch_block_device_mappings {
    device_name           = "/dev/xvda"
    volume_size           = var.volume_size_gib
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 125
    delete_on_termination = true
  }

  tags = {
    Name                      = "scdino-gpu-${var.os}"
    "parallelcluster:version" = var.pcluster_version
    "scdino:efa-installer"    = var.efa_installer_version
    "scdino:nccl"             = var.nccl_version
    "scdino:torch"            = var.torch_version
    "scdino:base-ami"         = "{{ .SourceAMI }}"
    "scdino:base-ami-name"    = "{{ .SourceAMIName }}"
  }
}

build {
  sources = ["source.amazon-ebs.gpu"]

  provisioner "shell" {
    execute_command = "sudo -E bash '{{ .Path }}'"
    environment_vars = [
      "EFA_INSTALLER_VERSION=${var.efa_installer_version}",
      "EFA_INSTALLER_SHA256=${var.efa_installer_sha256}",
      "NCCL_VERSION=${var.nccl_version}",
      "NCCL_TESTS_VERSION=${var.nccl_tests_version}",
      "TORCH_VERSION=${var.torch_version}",
      "TORCHVISION_VERSION=${var.torchvision_version}",
    ]
    scripts = [
      "scripts/00-check-gpu-driver.sh",
      "scripts/10-efa.sh",
      "scripts/20-nccl.sh",
      "scripts/30-nccl-tests.sh",
      "scripts/40-dcgm.sh",
      "scripts/50-python-env.sh",
      "scripts/90-cleanup.sh",
    ]
  }

  post-processor "manifest" {
    output     = "packer-manifest.json"
    strip_path = true
  }
}
