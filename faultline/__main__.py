from faultline.cli import run
import sys
sys.exit(run())
