"""ProSec: proactive security alignment of code models (Xu et al., ICML 2025), with bandit as the analyzer."""
