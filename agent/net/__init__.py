"""The networking layer: the HTTP client every wing that goes out over HTTP uses (the image
pipeline's downloads, uploads, the BMC clients, the site's upstream side)."""
