# Plugin requirements for `packer init` (Packer >= 1.7, as installed by the image pipeline's
# CodeBuild project). Kept apart from the template so that older Packer releases, which do not
# know this block, can still validate gpu-image.pkr.hcl on its own.
packer {
  required_plugins {
    amazon = {
      version = ">= 1.3.0"
      source  = "github.com/hashicorp/amazon"
    }
  }
}
