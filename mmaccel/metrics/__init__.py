"""Image-quality metrics: FID with the standard Inception weights (`fid`) and a fast Fashion-MNIST
"domain FID" on a small shipped classifier (`domain`)."""
